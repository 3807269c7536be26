"""PromptReuse (`kvgate.router.core.reuse`) gives exactly the ids and digests of a fresh encode + hash."""

from __future__ import annotations

import random
from pathlib import Path

import tokenizers
from tests.unit.traced_bytes import traced_bytes
from tokenizers import AddedToken, models, pre_tokenizers

from kvgate.api.router_config import EngineConfig, TokenizerConfig
from kvgate.prefix import BlockHasher, LoraKey, Tokenizer
from kvgate.router.core.keys import Keyer
from kvgate.router.core.reuse import PromptReuse, common_prefix
from kvgate.router.core.tokenize import load_request_tokenizer

TOKENIZER = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"
WORDS = ["alpha", "beta", "gamma", "delta", "x", "y", "z", "é", "\n", "  "]


def _fresh(tokenizer: Tokenizer, text: str, salt: str | None, lora: LoraKey | None, size: int):
    ids = tokenizer.encode_uncached(text, add_special_tokens=False)
    digests = BlockHasher("sha256", size, cache_bytes=0).hash_blocks(
        ids, cache_salt=salt, lora=lora
    )
    return tuple(ids), digests


def test_common_prefix_matches_a_character_scan():
    rng = random.Random(0)
    for _ in range(300):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 9000)))
        b = a[: rng.randint(0, len(a))] + "".join(
            rng.choice("ab") for _ in range(rng.randint(0, 50))
        )
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n


def test_interleaved_sessions_salts_and_loras_are_exact_and_reused():
    tokenizer = Tokenizer.from_dir(TOKENIZER)
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 4), max_bytes=1 << 20)
    rng = random.Random(1)
    system = "<|im_start|>system\n" + " ".join(rng.choice(WORDS) for _ in range(200))
    sessions = [system for _ in range(5)]
    lora = LoraKey("a", "/a")
    for step in range(200):
        s = rng.randrange(len(sessions))
        if rng.random() < 0.2:  # a rewritten turn: the history diverges somewhere
            sessions[s] = sessions[s][: rng.randint(0, len(sessions[s]))]
        sessions[s] += "<|im_end|>\n<|im_start|>user\n" + " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(1, 60))
        )
        text = sessions[s] + rng.choice(["<|im_start|>assistant\n", "<|im_end|>", "<|im", ""])
        salt = [None, "t1"][s % 2]  # a tenant's sessions share a salt
        which = lora if s == 4 or rng.random() < 0.05 else None
        got = reuse.ids_and_digests(text, cache_salt=salt, lora=which)
        assert got == _fresh(tokenizer, text, salt, which, 4), step
    assert reuse.reused_tokens > 2 * reuse.encoded_tokens


def test_a_longer_added_token_past_the_common_prefix_is_not_cut():
    backend = tokenizers.Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(["ab", "cd", "y>cd", "[UNK]"])}, "[UNK]")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_tokens([AddedToken("<x>", normalized=False), AddedToken("<x>y>", normalized=False)])
    tokenizer = Tokenizer(backend)
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 1), head_chars=2)
    for text in ["ab<x>ab ab", "ab<x>y>cd", "ab<x> cd<x>y>", "ab<x> cd<x>y>cd"]:
        got = reuse.ids_and_digests(text, cache_salt=None, lora=None)
        assert got == _fresh(tokenizer, text, None, None, 1), text


def test_tokens_split_in_two_stages_are_not_cut_before_their_lookahead():
    """Tokens matched on the raw text and on the (identical) normalised text, overlapping: the
    second stage's split near a cut also depends on where the first stage cut the piece."""
    backend = tokenizers.Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(["ab", "q", "y>", "x>", "[UNK]"])}, "[UNK]")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_tokens([AddedToken("<x>", normalized=False), AddedToken("<x>y>", normalized=False)])
    backend.add_tokens([AddedToken(t, normalized=True) for t in ("q<x", "y><z>", "<z>")])
    tokenizer = Tokenizer(backend)
    assert tokenizer.segmented
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 1), head_chars=1)
    rng = random.Random(4)
    bits = ["q", "<x>", "y>", "<z>", "x>", "<", " ab", "ab"]
    history = "ab"
    for step in range(400):
        if rng.random() < 0.1:
            history = history[: rng.randint(1, len(history))]
        history += "".join(rng.choice(bits) for _ in range(rng.randint(1, 6)))
        got = reuse.ids_and_digests(history, cache_salt=None, lora=None)
        assert got == _fresh(tokenizer, history, None, None, 1), (step, history)
    assert reuse.reused_tokens > 0
    # "<z>" ends at 3 in the first text, whose first stage cut the piece at "<xxxxxx>"; in the
    # second that token is gone, so "<z>ab<x" is matched instead. The texts share 11
    # characters: 3 plus the longest token of either stage (8) fits, 3 + 8 + 7 does not.
    backend.add_tokens([AddedToken("<xxxxxx>", normalized=False)])
    backend.add_tokens([AddedToken("<z>ab<x", normalized=True)])
    tokenizer = Tokenizer(backend)
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 1), head_chars=1)
    for text in ["<z>ab<xxxxxx> ab", "<z>ab<xxxxx! ab"]:
        got = reuse.ids_and_digests(text, cache_salt=None, lora=None)
        assert got == _fresh(tokenizer, text, None, None, 1), text


def test_known_digests_continue_the_chain():
    hasher = BlockHasher("sha256", 4, span_blocks=2)
    tokens = list(range(50))
    full = BlockHasher("sha256", 4, cache_bytes=0).hash_blocks(tokens, cache_salt="s")
    for known in range(len(full) + 1):
        hasher.cache.clear()
        assert hasher.hash_blocks(tokens, cache_salt="s", known=full[:known]) == full


def test_keyer_keys_with_reuse_equal_keys_without():
    requests = load_request_tokenizer(TokenizerConfig(path=str(TOKENIZER)))
    assert requests is not None
    engine = EngineConfig(int_block_hashes=True, tokenizer=TokenizerConfig(path=str(TOKENIZER)))
    fast, plain = Keyer(engine, requests), Keyer(engine, requests)
    plain.reuse = None
    assert fast.reuse is not None
    history = [{"role": "system", "content": "Be brief. " * 50}]
    for turn in range(8):
        history.append({"role": "user", "content": f"question {turn} " * 20})
        for body in (
            {"messages": history},
            {"messages": history, "add_special_tokens": True},
            {"messages": history, "truncate_prompt_tokens": 30},
        ):
            assert fast.keys(body, "chat", "salt") == plain.keys(body, "chat", "salt")
        history.append({"role": "assistant", "content": f"answer {turn} " * 30})
    assert fast.reuse.reused_tokens > 0


def test_a_session_hint_finds_its_own_history_among_many_sessions():
    tokenizer = Tokenizer.from_dir(TOKENIZER)
    rng = random.Random(2)
    system = "<|im_start|>system\n" + " ".join(rng.choice(WORDS) for _ in range(100))
    reused = {}
    for hinted in (False, True):
        reuse = PromptReuse(tokenizer, BlockHasher("sha256", 4), bucket=2)
        sessions = [system] * 12  # more sessions with one system prompt than a bucket holds
        for step in range(120):
            s = step % len(sessions)
            sessions[s] += "<|im_end|>\n<|im_start|>user\n" + f"{s} " * 40
            text = sessions[s] + "<|im_start|>assistant\n"
            got = reuse.ids_and_digests(
                text, cache_salt=None, lora=None, session=f"s{s}" if hinted else None
            )
            assert got == _fresh(tokenizer, text, None, None, 4), (hinted, step)
        reused[hinted] = reuse.reused_tokens / (reuse.reused_tokens + reuse.encoded_tokens)
    assert reused[True] > 0.7 and reused[True] > reused[False] + 0.3, reused


def test_kept_prompts_are_bounded_in_bytes_and_cost_what_is_counted():
    tokenizer = Tokenizer.from_dir(TOKENIZER)
    budget = 2 << 20
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 16, cache_bytes=0), max_bytes=budget)
    rng = random.Random(3)
    texts = [
        f"<|im_start|>system\n{i} " + " ".join(rng.choice(WORDS) for _ in range(2000))
        for i in range(40)
    ]
    for text in texts[:2]:
        reuse.ids_and_digests(text, cache_salt=None, lora=None)  # warm the free lists
    counted = reuse.bytes + tokenizer.segments.bytes  # the tokenizer keeps its pieces too
    with traced_bytes(__file__) as used:
        for text in texts[2:12]:
            reuse.ids_and_digests(text, cache_salt=None, lora=None)
    assert used.bytes <= (reuse.bytes + tokenizer.segments.bytes - counted) * 1.1
    for text in texts[12:]:
        reuse.ids_and_digests(text, cache_salt=None, lora=None, session=text[-20:])
    assert 0 < reuse.bytes <= budget


def test_concurrent_sessions_stay_exact():
    import threading

    tokenizer = Tokenizer.from_dir(TOKENIZER)
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 4), max_bytes=1 << 20)
    errors: list[str] = []

    def session(s: int) -> None:
        rng = random.Random(s)
        text = "<|im_start|>system\n" + " ".join(rng.choice(WORDS) for _ in range(100))
        for turn in range(40):
            text += "<|im_end|>\n<|im_start|>user\n" + " ".join(
                rng.choice(WORDS) for _ in range(rng.randint(1, 40))
            )
            got = reuse.ids_and_digests(text, cache_salt=f"t{s % 2}", lora=None, session=str(s))
            if got != _fresh(tokenizer, text, f"t{s % 2}", None, 4):
                errors.append(f"session {s} turn {turn}")

    threads = [threading.Thread(target=session, args=(s,)) for s in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and reuse.reused_tokens > reuse.encoded_tokens


def test_a_turn_over_the_limit_is_refused_counting_the_reused_prefix():
    import pytest

    from kvgate.prefix import PromptTooLong

    tokenizer = Tokenizer.from_dir(TOKENIZER)
    reuse = PromptReuse(tokenizer, BlockHasher("sha256", 4))
    text = "<|im_start|>system\n" + "alpha beta " * 300 + "<|im_end|>\n"
    ids, _ = reuse.ids_and_digests(text, cache_salt=None, lora=None, session="s")
    longer = text + "<|im_start|>user\n" + "gamma " * 300
    with pytest.raises(PromptTooLong) as raised:
        reuse.ids_and_digests(
            longer, cache_salt=None, lora=None, session="s", max_tokens=len(ids) + 10
        )
    assert raised.value.limit == len(ids) + 10
    full, _ = reuse.ids_and_digests(longer, cache_salt=None, lora=None, session="s")
    assert (
        reuse.ids_and_digests(
            longer, cache_salt=None, lora=None, session="s", max_tokens=len(full)
        )[0]
        == full
    )
