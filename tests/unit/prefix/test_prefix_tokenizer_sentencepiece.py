"""SentencePiece-style tokenizers (a ``▁`` space marker, prepended to pieces) encoded piece by
piece and in parts give the library's ids, exactly.

The shapes are those of real models' tokenizer.json files (`kvgate.prefix.tokenizer_shape`):
Llama 2 and Mistral v0.1 (a ``Prepend`` normaliser, BPE over the whole piece), Llama and
Mistral converted without ``legacy`` (Metaspace prepending to the first piece only), Gemma (the
space replaced, no prepending), and Metaspace with ``split`` over BPE and Unigram models. The
models are trained here as SentencePiece trains them (a word never crosses a ``▁``), with byte
fallback; each test compares with the ``tokenizers`` library on random texts with many added
tokens, texts that start with one or with a space, and prompts resent with a longer tail.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import tokenizers
from tests.unit.prefix.random_texts import random_text
from tokenizers import models, pre_tokenizers, trainers

from kvgate.prefix.tokenizer import SUBPIECE_CHARS, Tokenizer
from kvgate.prefix.tokenizer_shape import tokenizer_shape

SPECIALS = ["<start_of_turn>", "<end_of_turn>", "</s>"]
BYTES = [f"<0x{value:02X}>" for value in range(256)]
PREPEND = {"type": "Prepend", "prepend": "▁"}
REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
NFKC = {"type": "NFKC"}


def _metaspace(scheme: str, *, split: bool) -> dict[str, Any]:
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}


def _trained_spec(model: str, *, words_cross_spaces: bool = False) -> dict[str, Any]:
    """A model trained on random texts, as SentencePiece trains one (each word starts with its
    ``▁``) unless ``words_cross_spaces``; the vocabulary has the 256 byte-fallback tokens."""
    rng = random.Random(11)
    corpus = [random_text(rng, 400, SPECIALS) for _ in range(300)]
    special = ["<unk>", "<s>", *SPECIALS]
    if model == "BPE":
        backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        trainer: Any = trainers.BpeTrainer(
            vocab_size=900, special_tokens=special, show_progress=False
        )
    else:
        backend = tokenizers.Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=600, special_tokens=special, unk_token="<unk>", show_progress=False
        )
    if words_cross_spaces:
        backend.normalizer = tokenizers.normalizers.Replace(" ", "▁")
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    backend.train_from_iterator(corpus, trainer=trainer)
    spec: dict[str, Any] = json.loads(backend.to_str())
    vocab = spec["model"]["vocab"]
    if model == "BPE":
        spec["model"]["byte_fallback"] = True
        for token in BYTES:
            vocab.setdefault(token, len(vocab))
    else:
        spec["model"]["byte_fallback"] = True
        vocab.extend([token, 0.0] for token in BYTES)
    bos = spec["model"]["vocab"]["<s>"] if model == "BPE" else 1
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}},
    }
    for token in spec["added_tokens"]:
        token["normalized"] = False
    return spec


BPE = _trained_spec("BPE")
UNIGRAM = _trained_spec("Unigram")
CROSSING_BPE = _trained_spec("BPE", words_cross_spaces=True)


def _shaped(spec: dict[str, Any], normalizer: Any, pre_tokenizer: Any) -> tokenizers.Tokenizer:
    shaped = {**spec, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer}
    return tokenizers.Tokenizer.from_str(json.dumps(shaped))


# name -> (backend, whether long pieces are cut)
SHAPES: dict[str, tuple[tokenizers.Tokenizer, bool]] = {
    "Llama 2 (Prepend + Replace, BPE over the piece)": (
        _shaped(BPE, {"type": "Sequence", "normalizers": [PREPEND, REPLACE]}, None),
        True,
    ),
    "Llama without legacy (Metaspace first, no split)": (
        _shaped(BPE, None, _metaspace("first", split=False)),
        True,
    ),
    "Gemma (Replace, BPE over the piece)": (_shaped(BPE, REPLACE, None), True),
    "Metaspace first, split": (_shaped(BPE, None, _metaspace("first", split=True)), True),
    "Metaspace always, split, NFKC": (_shaped(BPE, NFKC, _metaspace("always", split=True)), True),
    "Metaspace always, no split": (_shaped(BPE, None, _metaspace("always", split=False)), True),
    "Unigram, Metaspace always, split": (
        _shaped(UNIGRAM, None, _metaspace("always", split=True)),
        True,
    ),
    "Unigram, Metaspace first, no split": (
        _shaped(UNIGRAM, None, _metaspace("first", split=False)),
        False,  # Viterbi over the whole piece: a best path may cross the cut
    ),
    "BPE whose merges cross the marker (Replace)": (_shaped(CROSSING_BPE, REPLACE, None), False),
}


def _texts(rng: random.Random) -> list[str]:
    """Long and short texts with many added tokens, some starting with one or with spaces."""
    texts = []
    for _ in range(30):
        chars = rng.choice([200, 2_000, 3 * SUBPIECE_CHARS])
        text = random_text(rng, chars, SPECIALS, special_rate=rng.choice([0.0, 0.01, 0.05]))
        text = rng.choice(["", " ", "  ", "▁", "\n", rng.choice(SPECIALS), "<s>"]) + text
        texts.append(text)
    return texts


@pytest.mark.parametrize("name", list(SHAPES))
def test_pieces_and_parts_give_the_librarys_ids(name):
    backend, cuts = SHAPES[name]
    tok = Tokenizer(backend)
    assert tok.segmented
    rng = random.Random(name)
    for text in _texts(rng):
        for special in (False, True):
            expected = backend.encode(text, add_special_tokens=special).ids
            assert tok.encode(text, add_special_tokens=special) == expected, repr(text[:80])
    for text in _texts(rng):  # again, mostly from the segment cache
        assert tok.encode(text) == backend.encode(text).ids
    assert tok.cuts_at_spaces is cuts


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_tail_after_an_added_token_continues_the_prompt(name):
    """`encode_tail(..., starts_text=False)` after a prefix that ends with an added token gives
    the rest of the whole prompt's ids (what prompt reuse relies on)."""
    backend, _ = SHAPES[name]
    tok = Tokenizer(backend)
    rng = random.Random(f"{name} tail")
    for text in _texts(rng):
        head = "hello world" + rng.choice(SPECIALS)
        whole = backend.encode(head + text, add_special_tokens=False).ids
        prefix = backend.encode(head, add_special_tokens=False).ids
        tail, _ = tok.encode_tail(text, starts_text=False)
        assert prefix + tail == whole, repr(text[:80])
        alone, _ = tok.encode_tail(head + text)
        assert alone == whole


@pytest.mark.parametrize(
    "name",
    [name for name, (_, cuts) in SHAPES.items() if cuts],
)
def test_a_document_asked_about_again_costs_only_its_last_part(name):
    backend, _ = SHAPES[name]
    tok = Tokenizer(backend)
    document = random_text(random.Random(5), 12 * SUBPIECE_CHARS, SPECIALS, special_rate=0.0)
    first = "Answer from the document.\n\n" + document + "\n\nQuestion: what is it?"
    second = "Answer from the document.\n\n" + document + "\n\nQuestion: who wrote it, and when?"
    tok.encode(first)
    misses = tok.segment_misses
    assert tok.encode(second) == backend.encode(second).ids
    assert tok.segment_misses - misses == 1  # the part holding the new question
    assert len(tok._parts(second)) >= 10


def test_prepending_after_another_normaliser_is_tokenized_whole():
    """Metaspace "first" after NFKC (which can turn a first character into a space), a
    ``Prepend`` beside a normaliser other than the space's ``Replace``, and a ``Prepend``
    before Metaspace "first" (each piece alone would be first): no pieces, same ids."""
    for normalizer, pre_tokenizer in (
        (NFKC, _metaspace("first", split=True)),
        ({"type": "Sequence", "normalizers": [PREPEND, REPLACE, NFKC]}, None),
        ({"type": "Prepend", "prepend": "x"}, _metaspace("first", split=False)),
    ):
        backend = _shaped(BPE, normalizer, pre_tokenizer)
        spec = json.loads(backend.to_str())
        assert not tokenizer_shape(spec).alone
        tok = Tokenizer(backend)
        assert not tok.segmented
        for text in _texts(random.Random(2))[:10]:
            assert tok.encode(text) == backend.encode(text).ids


def test_the_merges_decide_whether_a_piece_is_cut():
    spec = json.loads(SHAPES["Gemma (Replace, BPE over the piece)"][0].to_str())
    assert tokenizer_shape(spec).cuts_at_spaces
    merges = [*spec["model"]["merges"], ["e", "▁"]]  # now "e" + "▁" may merge
    assert not tokenizer_shape(
        {**spec, "model": {**spec["model"], "merges": merges}}
    ).cuts_at_spaces
    for change in ({"ignore_merges": True}, {"dropout": 0.1}, {"end_of_word_suffix": "</w>"}):
        assert not tokenizer_shape({**spec, "model": {**spec["model"], **change}}).cuts_at_spaces


@pytest.mark.parametrize(
    ("normalizer", "pre_tokenizer"),
    [
        ({"type": "Sequence", "normalizers": [PREPEND, REPLACE]}, None),
        (None, _metaspace("first", split=False)),
    ],
)
def test_an_added_token_starting_with_the_marker_is_not_made_by_the_lead(normalizer, pre_tokenizer):
    """CodeLlama's `▁<PRE>`: the library splits on added tokens before it prepends `▁`, so the
    `▁` kvgate puts before a piece must not complete one."""
    backend = _shaped(BPE, normalizer, pre_tokenizer)
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, normalized=False) for t in ("▁<PRE>", "▁<SUF>", "▁ab")]
    )
    tok = Tokenizer(backend)
    assert tok.segmented
    for text in ["<PRE> foo", "ab cd", "<start_of_turn>ab", "x ▁<PRE> y<SUF>", " <SUF>"]:
        for special in (False, True):
            expected = backend.encode(text, add_special_tokens=special).ids
            assert tok.encode(text, add_special_tokens=special) == expected, text


@pytest.mark.parametrize(
    "pre_tokenizer",
    [
        {"type": "Sequence", "pretokenizers": [_metaspace("first", split=True)]},
        {
            "type": "Sequence",
            "pretokenizers": [{"type": "WhitespaceSplit"}, _metaspace("first", split=True)],
        },
    ],
)
def test_a_first_only_metaspace_inside_a_sequence_is_tokenized_whole(pre_tokenizer):
    """T5 converted without `legacy`: a sequence ending in Metaspace "first"; not reproduced,
    so no pieces, and the library's ids."""
    backend = _shaped(BPE, None, pre_tokenizer)
    tok = Tokenizer(backend)
    assert not tok.segmented
    for text in [*_texts(random.Random(6))[:10], "<start_of_turn>hello world"]:
        assert tok.encode(text) == backend.encode(text).ids, repr(text[:80])
