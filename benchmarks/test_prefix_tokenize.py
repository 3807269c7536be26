"""Prompt → tokens → block keys for agent turns (the router's per-request prefix work).

    .venv/bin/python -m pytest benchmarks/test_prefix_tokenize.py --benchmark-only -q

An agent session resends its growing history every turn. `cold`: a loaded tokenizer without
segment cache and an empty chain cache (nothing of the prompt seen). `next_turn`: the previous turn was seen; the new turn appends a tool call and
its result (~1k tokens). Sizes are the prompt's length in tokens of the test tokenizer.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.prefix import BlockHasher, RequestTokenizer, Tokenizer

DATA = Path(__file__).parents[1] / "tests" / "data" / "prefix"
SIZES = [2048, 8192, 32768]


def _history(target_tokens: int, requests: RequestTokenizer) -> list[dict[str, Any]]:
    doc = json.loads((DATA / "conversations.json").read_text())
    pool = [m for c in doc["conversations"] for m in c["messages"][2:]]
    messages: list[dict[str, Any]] = doc["conversations"][0]["messages"][:1]
    for i in itertools.count():
        message = dict(pool[i % len(pool)])
        if message.get("content"):
            message["content"] = f"[{i}] {message['content']}"
        messages.append(message)
        if message["role"] in {"user", "tool"}:
            tokens = len(requests.chat_token_ids({"messages": messages}))
            if tokens >= target_tokens:
                return messages
    raise AssertionError("unreachable")


def _new_turn(n: int) -> list[dict[str, Any]]:
    result = "\n".join(f"line {n}.{k}: output of the command, some text" for k in range(80))
    return [
        {"role": "assistant", "content": f"Let me look at step {n}."},
        {"role": "user", "content": result},
    ]


@pytest.fixture(scope="module", params=SIZES, ids=[f"{s // 1024}k" for s in SIZES])
def history(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    requests = RequestTokenizer(Tokenizer.from_dir(DATA / "tokenizer"))
    return _history(int(request.param), requests)


def test_tokenize_and_hash_cold(benchmark, history):
    # A loaded tokenizer, but nothing of this prompt seen: no segment cache, empty chain cache.
    requests = RequestTokenizer(Tokenizer.from_dir(DATA / "tokenizer", segment_cache_bytes=0))
    requests.chat_token_ids({"messages": history[:2]})

    def setup():
        return (BlockHasher("sha256", 16),), {}

    def run(hasher: BlockHasher) -> int:
        return len(hasher.block_keys(requests.chat_token_ids({"messages": history})))

    benchmark.pedantic(run, setup=setup, rounds=15, iterations=1)


def test_tokenize_and_hash_next_turn(benchmark, history):
    requests = RequestTokenizer(Tokenizer.from_dir(DATA / "tokenizer"))
    hasher = BlockHasher("sha256", 16)
    hasher.block_keys(requests.chat_token_ids({"messages": history}))
    turns = itertools.count()

    def setup():
        return ({"messages": [*history, *_new_turn(next(turns))]},), {}

    def run(body: dict[str, Any]) -> int:
        return len(hasher.block_keys(requests.chat_token_ids(body)))

    benchmark.pedantic(run, setup=setup, rounds=30, iterations=1)


def test_render_only(benchmark, history):
    requests = RequestTokenizer(Tokenizer.from_dir(DATA / "tokenizer"))
    benchmark(requests.chat_text, {"messages": history})
