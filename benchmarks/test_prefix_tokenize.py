"""Prompt → tokens → block keys for agent turns (the router's per-request prefix work).

    .venv/bin/python -m pytest benchmarks/test_prefix_tokenize.py --benchmark-only -q

An agent session resends its growing history every turn. `cold`: a loaded tokenizer without
segment cache and an empty chain cache (nothing of the prompt seen). `next_turn`: the previous turn was seen; the new turn appends a tool call and
its result (~1k tokens). Sizes are the prompt's length in tokens of the test tokenizer.

`document_question`: a completion prompt (instructions, a document of about `size` tokens,
a new question each time) whose document was asked about before: `parts` with the tokenizer's
long pieces cut before spaces (the default, `kvgate.prefix.tokenizer`), `whole` with that off
(the document is one piece, tokenized again for every question).

Each runs with two tokenizers: `byte-level`, the repository's test tokenizer (GPT-2 regex), and
`sentencepiece`, a tokenizer of Llama 2's shape (a `▁` prepended to every piece, BPE over the
whole piece, byte fallback) trained here on the same texts, with the same added tokens and chat
template.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from kvgate.prefix import BlockHasher, RequestTokenizer, Tokenizer

DATA = Path(__file__).parents[1] / "tests" / "data" / "prefix"
SIZES = [2048, 8192, 32768]
KINDS = ["byte-level", "sentencepiece"]


@functools.cache
def _sentencepiece_spec() -> str:
    """Llama 2's shape, trained on the conversations as SentencePiece trains (words start with
    their ``▁``), with the repository tokenizer's added tokens."""
    byte_level = tokenizers.Tokenizer.from_file(str(DATA / "tokenizer" / "tokenizer.json"))
    added = [t.content for t in byte_level.get_added_tokens_decoder().values()]
    doc = json.loads((DATA / "conversations.json").read_text())
    texts = [m["content"] for c in doc["conversations"] for m in c["messages"] if m.get("content")]
    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<unk>", *added], show_progress=False
    )
    backend.train_from_iterator(texts, trainer=trainer)
    spec = json.loads(backend.to_str())
    vocab = spec["model"]["vocab"]
    for value in range(256):
        vocab.setdefault(f"<0x{value:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None
    for token in spec["added_tokens"]:
        token["normalized"] = False
    return json.dumps(spec)


def _tokenizer(kind: str, segment_cache_bytes: int | None = None) -> Tokenizer:
    cache = {} if segment_cache_bytes is None else {"segment_cache_bytes": segment_cache_bytes}
    byte_level = Tokenizer.from_dir(DATA / "tokenizer", **cache)
    if kind == "byte-level":
        return byte_level
    backend = tokenizers.Tokenizer.from_str(_sentencepiece_spec())
    return Tokenizer(backend, byte_level.config, name="sentencepiece", **cache)


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


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_tokenize_and_hash_cold(benchmark, history, kind):
    # A loaded tokenizer, but nothing of this prompt seen: no segment cache, empty chain cache.
    requests = RequestTokenizer(_tokenizer(kind, segment_cache_bytes=0))
    requests.chat_token_ids({"messages": history[:2]})

    def setup():
        return (BlockHasher("sha256", 16),), {}

    def run(hasher: BlockHasher) -> int:
        return len(hasher.block_keys(requests.chat_token_ids({"messages": history})))

    benchmark.pedantic(run, setup=setup, rounds=15, iterations=1)


def test_tokenize_and_hash_next_turn(benchmark, history, kind):
    requests = RequestTokenizer(_tokenizer(kind))
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


@pytest.mark.parametrize("cut", ["parts", "whole"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{s // 1024}k" for s in SIZES])
def test_tokenize_and_hash_document_question(benchmark, size, cut, kind):
    tokenizer = _tokenizer(kind)
    tokenizer.cuts_at_spaces = cut == "parts"
    hasher = BlockHasher("sha256", 16)
    doc = json.loads((DATA / "conversations.json").read_text())
    texts = [m["content"] for c in doc["conversations"] for m in c["messages"] if m.get("content")]
    document = ""
    for i in itertools.count():
        document += f"{texts[i % len(texts)]} [{i}]\n"
        if len(tokenizer.encode_uncached(document, add_special_tokens=False)) >= size:
            break
    head = "Answer the question from the document below.\n\n" + document
    tokenizer.encode(head + "\n\nQuestion: what is this about?")
    hasher.block_keys(tokenizer.encode(head + "\n\nQuestion: what is this about?"))
    questions = itertools.count()

    def setup():
        return (f"{head}\n\nQuestion {next(questions)}: which command ran last, and why?",), {}

    def run(prompt: str) -> int:
        return len(hasher.block_keys(tokenizer.encode(prompt)))

    benchmark.pedantic(run, setup=setup, rounds=30, iterations=1)
