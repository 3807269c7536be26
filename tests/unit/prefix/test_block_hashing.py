"""BlockHasher against a direct transcription of vLLM's formula, cache behaviour, key forms."""

from __future__ import annotations

import hashlib
import pickle
import random

import cbor2
import pytest
from tests.unit.traced_bytes import traced_bytes

from kvgate.prefix import (
    BlockHasher,
    LoraKey,
    block_key,
    extra_keys_for_block,
    int_block_key,
    int_form,
    max_cacheable_blocks,
    none_hash,
)
from kvgate.prefix.hashing import span_entry_bytes


def reference_hashes(algo, block_size, seed, tokens, lora=None, salt=None):
    """The formula of vLLM's hash_block_tokens, written out longhand."""

    def fn(obj):
        if algo == "sha256":
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            data = cbor2.dumps(obj, canonical=True)
        return hashlib.sha256(data).digest()

    parent = fn(seed)
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        keys = []
        if lora:
            keys.append(("lora", lora.name, lora.path))
        if start == 0 and salt:
            keys.append(("cache_salt", salt))
        parent = fn((parent, tuple(tokens[start : start + block_size]), tuple(keys) or None))
        out.append(parent)
    return out


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 16, 64])
def test_matches_formula_for_every_shape(algo, block_size):
    rng = random.Random(block_size)
    # token ids of every pickle/CBOR width, including ints above 2**31 and 2**32
    pool = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40]
    tokens = [rng.choice(pool) if i % 3 else rng.randrange(200_000) for i in range(300)]
    lora = LoraKey("adapter-a", "/models/adapter-a")
    for kwargs in ({}, {"lora": lora}, {"salt": "tenant-1"}, {"lora": lora, "salt": "t"}):
        hasher = BlockHasher(algo, block_size, "1234")
        got = hasher.hash_blocks(tokens, lora=kwargs.get("lora"), cache_salt=kwargs.get("salt"))
        assert got == reference_hashes(algo, block_size, "1234", tokens, **kwargs)


def test_only_full_blocks_are_hashed():
    hasher = BlockHasher("sha256", 16)
    assert hasher.hash_blocks(list(range(15))) == []
    assert len(hasher.hash_blocks(list(range(47)))) == 2


def test_default_seed_is_vllms():
    assert BlockHasher().none_hash == none_hash("sha256", "vllm-none-hash")
    assert BlockHasher(seed="0").none_hash != BlockHasher().none_hash


def test_salt_changes_every_block_through_the_chain_but_keys_only_block_zero():
    tokens = list(range(64))
    plain = BlockHasher().hash_blocks(tokens)
    salted = BlockHasher().hash_blocks(tokens, cache_salt="s")
    assert all(a != b for a, b in zip(plain, salted, strict=True))
    assert extra_keys_for_block(0, cache_salt="s") == (("cache_salt", "s"),)
    assert extra_keys_for_block(1, cache_salt="s") is None
    assert BlockHasher().hash_blocks(tokens, cache_salt="") == plain  # vLLM: falsy salt ignored


def test_lora_key_order_matches_vllm():
    lora = LoraKey("n", "p")
    assert extra_keys_for_block(0, lora, "s") == (("lora", "n", "p"), ("cache_salt", "s"))
    assert extra_keys_for_block(5, lora, "s") == (("lora", "n", "p"),)


def test_reused_prefix_hashes_only_new_blocks():
    hasher = BlockHasher("sha256", 16, span_blocks=8)
    history = list(range(16 * 100))
    first = hasher.hash_blocks(history)
    assert hasher.cache.hit_blocks == 0
    new_turn = [*history, *range(5000, 5000 + 16 * 30)]
    extended = hasher.hash_blocks(new_turn)
    assert extended[:100] == first
    assert hasher.cache.hit_blocks == 96  # 12 whole spans of 8 blocks were seen
    assert extended == BlockHasher("sha256", 16, cache_bytes=0).hash_blocks(new_turn)
    again = hasher.hash_blocks(new_turn)
    assert again == extended
    assert hasher.cache.hit_blocks == 96 + 128


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("span_blocks", [1, 3, 32])
def test_warm_cache_gives_the_uncached_answer(algo, span_blocks):
    rng = random.Random(span_blocks)
    cold = BlockHasher(algo, 4, "7", cache_bytes=0)
    warm = BlockHasher(algo, 4, "7", span_blocks=span_blocks)
    base = [rng.randrange(50_000) for _ in range(400)]
    for _ in range(30):  # histories that extend, fork and diverge from each other
        cut = rng.randrange(len(base))
        prompt = base[:cut] + [rng.randrange(50_000) for _ in range(rng.randrange(60))]
        salt = rng.choice([None, "a"])
        assert warm.hash_blocks(prompt, cache_salt=salt) == cold.hash_blocks(
            prompt, cache_salt=salt
        )
    assert warm.cache.hit_blocks > 0


def test_cache_separates_lora_and_salt():
    hasher = BlockHasher()
    tokens = list(range(64))
    plain = hasher.hash_blocks(tokens)
    assert hasher.hash_blocks(tokens, lora=LoraKey("a", "b")) != plain
    assert hasher.hash_blocks(tokens, cache_salt="x") != plain
    assert hasher.hash_blocks(tokens) == plain


def test_cache_is_bounded_in_bytes():
    budget = 4 * span_entry_bytes(1, 16)
    hasher = BlockHasher(cache_bytes=budget, span_blocks=1)
    for start in range(0, 16 * 50, 16):
        hasher.hash_blocks(list(range(start, start + 16)))
    assert 0 < len(hasher.cache) <= 4


def test_a_span_entry_costs_no_more_than_its_estimate():
    # The budget counts the worst case: every token id its own int object.
    hasher = BlockHasher(cache_bytes=1 << 30)
    tokens = [1000 + i for i in range(512 * 40)]
    BlockHasher(cache_bytes=0).hash_blocks(tokens)  # fills the interpreter's tuple free lists
    with traced_bytes(__file__) as used:
        hasher.hash_blocks([t + 0 for t in tokens])  # fresh ints, as parsed from JSON
    assert len(hasher.cache) == 40
    assert used.bytes <= 40 * span_entry_bytes(hasher.span_blocks, 16)


def test_int_form_is_low_64_bits_big_endian():
    digest = bytes(range(32))
    assert int_form(digest) == int.from_bytes(digest[-8:], "big")
    assert block_key(digest, int_keys=True) == int_block_key(int_form(digest)) == digest[-8:]
    assert block_key(digest) == digest
    assert block_key(int_form(digest)) == digest[-8:]
    with pytest.raises(ValueError):
        int_block_key(-1)
    with pytest.raises(ValueError):
        int_block_key(1 << 64)


def test_int_form_block_keys():
    hasher = BlockHasher()
    keys = hasher.block_keys(list(range(32)), int_form=True)
    digests = hasher.hash_blocks(list(range(32)))
    assert keys == [int_block_key(int_form(d)) for d in digests]


@pytest.mark.parametrize("bad", [{"algo": "xxhash"}, {"block_size": 0}])
def test_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        BlockHasher(**bad)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 0), (16, 0), (17, 1), (32, 1), (33, 2)])
def test_last_prompt_token_is_never_served_from_cache(tokens, blocks):
    assert max_cacheable_blocks(tokens, 16) == blocks
