"""kvgate's block hashes equal the ones vLLM's own code computed (tests/data/prefix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.prefix import BlockHasher, LoraKey, block_key, int_block_key, none_hash

VECTORS = json.loads(
    (Path(__file__).parents[2] / "data" / "prefix" / "hash_vectors.json").read_text()
)["cases"]


def _case_id(case: dict) -> str:
    return (
        f"{case['algo']}-bs{case['block_size']}-seed{case['seed']}"
        f"-salt{case['cache_salt']}-lora{bool(case['lora'])}"
    )


def test_vectors_cover_every_combination():
    combos = {
        (c["algo"], c["seed"], c["cache_salt"], c["lora"] is not None, c["block_size"])
        for c in VECTORS
    }
    assert len(combos) == 2 * 3 * 2 * 2 * 2


@pytest.mark.parametrize("case", VECTORS, ids=_case_id)
@pytest.mark.parametrize("cached", [False, True])
def test_block_hashes_match_vllm(case, cached):
    hasher = BlockHasher(case["algo"], case["block_size"], case["seed"])
    lora = LoraKey(case["lora"]["name"], case["lora"]["path"]) if case["lora"] else None
    if cached:  # a warm chain cache must give the same answer
        hasher.hash_blocks(case["token_ids"][: 2 * case["block_size"]], lora=lora)
        hasher.hash_blocks(case["token_ids"], lora=lora, cache_salt=case["cache_salt"])
    assert hasher.none_hash.hex() == case["none_hash"]
    assert none_hash(case["algo"], case["seed"]).hex() == case["none_hash"]
    digests = hasher.hash_blocks(case["token_ids"], lora=lora, cache_salt=case["cache_salt"])
    assert [d.hex() for d in digests] == case["block_hashes"]
    int_keys = hasher.block_keys(
        case["token_ids"], lora=lora, cache_salt=case["cache_salt"], int_form=True
    )
    assert int_keys == [int_block_key(v) for v in case["int_block_hashes"]]
    assert [block_key(v) for v in case["int_block_hashes"]] == int_keys
