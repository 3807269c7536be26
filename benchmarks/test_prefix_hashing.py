"""Block hashing: cold prompts and agent turns that extend a seen history.

    .venv/bin/python -m pytest benchmarks/test_prefix_hashing.py --benchmark-only -q

`cold`: a fresh hasher (empty chain cache) hashes the whole prompt. `reused`: the hasher has
seen the history; the prompt is that history plus a new 512-token turn (fresh every round),
as in a multi-turn agent session.
"""

from __future__ import annotations

import itertools
import random

import pytest

from kvgate.prefix import BlockHasher

SIZES = [2048, 8192, 32768, 131072]
NEW_TURN_TOKENS = 512


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(n)]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("num_tokens", SIZES)
def test_hash_cold(benchmark, num_tokens, algo):
    tokens = _tokens(num_tokens, num_tokens)

    def setup():
        return (BlockHasher(algo, 16), tokens), {}

    result = benchmark.pedantic(
        lambda hasher, toks: hasher.hash_blocks(toks), setup=setup, rounds=30, iterations=1
    )
    assert len(result) == num_tokens // 16


@pytest.mark.parametrize("num_tokens", SIZES)
def test_hash_reused_prefix(benchmark, num_tokens):
    history = _tokens(num_tokens - NEW_TURN_TOKENS, num_tokens)
    hasher = BlockHasher("sha256", 16)
    hasher.hash_blocks(history)
    turns = itertools.count()

    def setup():
        turn = _tokens(NEW_TURN_TOKENS, 10_000 + next(turns))
        return ([*history, *turn],), {}

    result = benchmark.pedantic(hasher.hash_blocks, setup=setup, rounds=30, iterations=1)
    assert len(result) == num_tokens // 16
