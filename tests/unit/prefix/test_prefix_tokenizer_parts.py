"""Long pieces cut before a space between two letters give the library's ids, exactly.

The cut is taken only for tokenizers whose normaliser, pre-tokenizer and model provably allow
it (`kvgate.prefix.tokenizer_shape`); these tests check the claim against the
`tokenizers` library itself on random texts full of what could break it (contractions, digit
runs, combining marks, NFC pairs, numbers that are not digits, whitespace runs, added tokens),
for the repository's byte-level tokenizer and BPE tokenizers trained here with the Llama 3,
Qwen 2, o200k and Tekken split patterns and DeepSeek V3's three splits (and normalisers).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tokenizers
from tests.unit.prefix.random_texts import random_text
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

from kvgate.prefix.tokenizer import CUT_WINDOW_CHARS, SUBPIECE_CHARS, Tokenizer
from kvgate.prefix.tokenizer_shape import (
    DEEPSEEK_V3_CJK,
    DEEPSEEK_V3_NUMBERS,
    DEEPSEEK_V3_PATTERN,
    LLAMA3_PATTERN,
    O200K_PATTERN,
    QWEN2_PATTERN,
    TEKKEN_PATTERN,
    tokenizer_shape,
)

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"
SPECIALS = ["<s>", "<|im_start|>", "<|im_end|>"]


def _text(rng: random.Random, chars: int) -> str:
    return random_text(rng, chars, SPECIALS)


def _trained(
    patterns: str | list[str], normalizer: normalizers.Normalizer | None
) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    if normalizer is not None:
        backend.normalizer = normalizer
    splits = [patterns] if isinstance(patterns, str) else patterns
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(p), behavior="isolated") for p in splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    rng = random.Random(7)
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([_text(rng, 400) for _ in range(300)], trainer=trainer)
    return backend


def _backends() -> dict[str, tokenizers.Tokenizer]:
    return {
        "byte-level (GPT-2 regex)": tokenizers.Tokenizer.from_file(
            str(TOKENIZER_DIR / "tokenizer.json")
        ),
        "Llama 3 split": _trained(LLAMA3_PATTERN, None),
        "Qwen 2 split, NFC": _trained(QWEN2_PATTERN, normalizers.NFC()),
        "o200k split": _trained(O200K_PATTERN, None),
        "Tekken split": _trained(TEKKEN_PATTERN, None),
        "DeepSeek V3 splits": _trained(
            [DEEPSEEK_V3_NUMBERS, DEEPSEEK_V3_CJK, DEEPSEEK_V3_PATTERN], None
        ),
        "Llama 3 split, Prepend": _trained(LLAMA3_PATTERN, normalizers.Prepend("▁")),
        "Llama 3 split, NFKC + lowercase": _trained(
            LLAMA3_PATTERN, normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        ),
    }


BACKENDS = _backends()


@pytest.mark.parametrize("name", list(BACKENDS))
def test_long_pieces_in_parts_give_the_librarys_ids(name):
    backend = BACKENDS[name]
    rng = random.Random(name)
    cuts = 0
    for _ in range(40):
        text = _text(rng, rng.choice([3 * SUBPIECE_CHARS, 6 * SUBPIECE_CHARS]))
        tok = Tokenizer(backend)  # an empty segment cache
        assert tok.segmented and tok.cuts_at_spaces
        expected = backend.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == expected
        assert tok.encode(text, add_special_tokens=False) == expected  # from the cache
        assert tok._splitter is not None
        cuts += sum(len(tok._parts(piece)) - 1 for piece in tok._splitter.split(text)[0::2])
    assert cuts > 40


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_document_asked_about_again_costs_only_its_last_part(name):
    backend = BACKENDS[name]
    tok = Tokenizer(backend)
    rng = random.Random(3)
    document = _text(rng, 12 * SUBPIECE_CHARS).replace("<|im_start|>", "").replace("<|im_end|>", "")
    document = document.replace("<s>", "")
    first = "Answer from the document.\n\n" + document + "\n\nQuestion: what is it?"
    second = "Answer from the document.\n\n" + document + "\n\nQuestion: who wrote it, and when?"
    tok.encode(first, add_special_tokens=False)
    misses = tok.segment_misses
    ids = tok.encode(second, add_special_tokens=False)
    assert ids == backend.encode(second, add_special_tokens=False).ids
    assert tok.segment_misses - misses == 1  # the part holding the new question
    assert len(tok._parts(second)) >= 10


def _cuts_at_spaces(**changes: object) -> bool:
    spec = json.loads(BACKENDS["Llama 3 split"].to_str())
    spec.update(changes)
    return tokenizer_shape(spec).cuts_at_spaces


def test_parts_only_where_provably_the_same():
    assert _cuts_at_spaces()
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    other_split = {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": r"\s+|\w+"},
                "behavior": "Isolated",
                "invert": False,
            },
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": False,
            },
        ],
    }
    prefix_space = {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}
    prepend = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]}
    strip = {"type": "Strip", "strip_left": True, "strip_right": True}
    model = json.loads(BACKENDS["Llama 3 split"].to_str())["model"]
    assert _cuts_at_spaces(pre_tokenizer=metaspace)  # every "▁" starts a pre-token
    assert not _cuts_at_spaces(pre_tokenizer={**metaspace, "split": False})  # no "▁" merges
    assert not _cuts_at_spaces(pre_tokenizer=other_split)
    deepseek = json.loads(BACKENDS["DeepSeek V3 splits"].to_str())["pre_tokenizer"]
    assert _cuts_at_spaces(pre_tokenizer=deepseek)
    steps = deepseek["pretokenizers"]
    without_words = {**deepseek, "pretokenizers": [*steps[:2], steps[3]]}
    assert not _cuts_at_spaces(pre_tokenizer=without_words)  # nothing starts one at the space
    assert not _cuts_at_spaces(pre_tokenizer=prefix_space)
    assert _cuts_at_spaces(normalizer=prepend)  # "▁" put before each piece by hand
    assert not _cuts_at_spaces(normalizer={**prepend, "normalizers": [prepend, strip]})
    assert not _cuts_at_spaces(normalizer=strip)
    assert not _cuts_at_spaces(model={**model, "dropout": 0.1})
    assert not _cuts_at_spaces(pre_tokenizer=None)


def test_one_long_text_fills_at_most_an_eighth_of_the_segment_cache():
    backend = BACKENDS["byte-level (GPT-2 regex)"]
    tok = Tokenizer(backend, segment_cache_bytes=1 << 20)
    text = _text(random.Random(9), 200 * SUBPIECE_CHARS)
    assert (
        tok.encode(text, add_special_tokens=False)
        == backend.encode(text, add_special_tokens=False).ids
    )
    assert 0 < tok.segments.bytes <= (1 << 20) // 8


def test_a_long_stretch_without_a_cut_ends_the_cutting():
    """Past `CUT_WINDOW_CHARS` without a space between two letters the rest is one part (the
    search never scans a huge piece character by character), and the ids stay the library's."""
    backend = BACKENDS["byte-level (GPT-2 regex)"]
    tok = Tokenizer(backend)
    words = _text(random.Random(4), 4 * SUBPIECE_CHARS).replace("<s>", "").replace("<|im", "")
    blob = "a1=" * (CUT_WINDOW_CHARS // 2)  # no letter-space-letter for 1.5 windows
    text = words + blob + words
    parts = tok._parts(text)
    assert 2 <= len(parts) <= 5  # cut through the first words, then never again
    assert len(parts[-1]) > len(blob)
    assert (
        tok.encode(text, add_special_tokens=False)
        == backend.encode(text, add_special_tokens=False).ids
    )
