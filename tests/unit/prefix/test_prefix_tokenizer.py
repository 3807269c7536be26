"""kvgate's tokenizer gives transformers' ids; the segment cache changes nothing but speed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.unit.traced_bytes import traced_bytes

from kvgate.prefix.segment_cache import SegmentCache
from kvgate.prefix.tokenizer import Tokenizer, TokenizerError

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"

TEXTS = [
    "",
    "hello world",
    " leading space and trailing  ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|><|im_start|>x<|im_end|><|im_end|>",
    "text<s>with bos<|endoftext|>inside",
    "unicode: héllo — 你好 🙂\n\ttabs",
    "<|im_start",  # a prefix of a special token is plain text
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(hf_tokenizer, text, add_special_tokens):
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    expected = hf_tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    assert tok.encode(text, add_special_tokens=add_special_tokens) == expected
    assert tok.encode_uncached(text, add_special_tokens=add_special_tokens) == expected


def test_bos_comes_from_the_post_processor():
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    bos = tok.token_id("<s>")
    assert tok.encode("hi")[0] == bos
    assert bos not in tok.encode("hi", add_special_tokens=False)


def test_segment_cache_equals_uncached_on_agent_histories(conversations, hf_tokenizer):
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    for conversation in conversations["conversations"]:
        text = ""
        for message in conversation["messages"]:  # a growing history, turn by turn
            text += f"<|im_start|>{message['role']}\n{message.get('content') or ''}<|im_end|>\n"
            assert tok.encode(text, add_special_tokens=False) == tok.encode_uncached(
                text, add_special_tokens=False
            )
        assert tok.encode(text) == hf_tokenizer(text)["input_ids"]
    assert tok.segment_hits > tok.segment_misses


def test_segment_cache_is_bounded_in_bytes():
    budget = 16 * 1024
    tok = Tokenizer.from_dir(TOKENIZER_DIR, segment_cache_bytes=budget)
    for i in range(200):
        tok.encode(f"<|im_start|>segment {i}: {'some words ' * 20}<|im_end|>")
    assert 0 < tok.segments.bytes <= budget
    assert 0 < len(tok.segments) < 200


def test_a_piece_over_an_eighth_of_the_budget_is_not_kept():
    tok = Tokenizer.from_dir(TOKENIZER_DIR, segment_cache_bytes=64 * 1024)
    tok.encode("<|im_start|>small<|im_end|>")
    kept = len(tok.segments)
    tok.encode("<|im_start|>" + "huge piece " * 2000 + "<|im_end|>")
    assert len(tok.segments) == kept  # the small entry survived, the huge one was not kept


def test_cached_ids_cost_what_the_budget_counts():
    tok = Tokenizer.from_dir(TOKENIZER_DIR, segment_cache_bytes=1 << 30)
    texts = [
        f"<|im_start|>message {i}: {'words and 1234 numbers ' * 40}<|im_end|>" for i in range(50)
    ]
    tok.encode(texts[0])  # warm the interpreter's free lists
    with traced_bytes(__file__) as used:
        for text in texts[1:]:
            tok.encode(text)
    counted = tok.segments.bytes - SegmentCache.entry_bytes(*_entry(tok, texts[0]))
    assert used.bytes <= counted * 1.1  # ids are canonical: 8 bytes per cached token


def _entry(tok, text):
    piece = text.removeprefix("<|im_start|>").removesuffix("<|im_end|>")
    ids = tok.segments.get(piece)
    assert ids is not None
    return piece, ids


def test_add_bos_eos_flags_follow_transformers(tmp_path):
    flags = {"add_bos_token": False, "add_eos_token": True}
    transformers = pytest.importorskip("transformers")
    shutil.copy(TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **flags}))
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = Tokenizer.from_dir(tmp_path)
    for text in TEXTS:
        assert tok.encode(text) == reference(text)["input_ids"]


def test_missing_or_broken_directory(tmp_path):
    with pytest.raises(TokenizerError):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError):
        Tokenizer.from_dir(tmp_path)


def test_special_tokens_and_template_from_config():
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    assert tok.special_tokens_map == {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template


def test_segment_cache_turns_itself_off_when_pieces_are_not_independent(tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        if token["content"] == "<|im_end|>":
            token["rstrip"] = True  # swallows the whitespace after it: pieces interact
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    shutil.copy(TOKENIZER_DIR / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    tok = Tokenizer.from_dir(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "<|im_start|>user\nhi<|im_end|>\n  \n<|im_start|>assistant\n"
    assert tok.encode(text) == reference(text)["input_ids"]
    assert tok.segment_hits == tok.segment_misses == 0  # went straight to the library


def test_decode_round_trips_text(hf_tokenizer):
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    text = "def main():\n    return 'héllo'\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids, skip_special_tokens=False).startswith("<s>")


def _with_normalized_tokens(normalizer: object = None) -> object:
    """The test tokenizer plus tokens matched on the raw text and on the normalised text that
    overlap ("q<x" starts before "<x>": the library finds "<x>" first, in its first stage)."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    spec["normalizer"] = normalizer
    backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
    backend.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in ("<x>", "<x>y>")])
    backend.add_tokens(
        [tokenizers.AddedToken(t, normalized=True) for t in ("q<x", "y><z>", "<z>", "<|U|>")]
    )
    return backend


def _overlapping_texts(seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    bits = ["q", "<x>", "y>", "<z>", "x>", "<", "<|U|>", "<|im_start|>", " hello", "\n", "ab"]
    return ["".join(rng.choice(bits) for _ in range(rng.randint(1, 60))) for _ in range(300)]


def test_tokens_matched_on_the_normalized_text_are_split_second():
    backend = _with_normalized_tokens()
    tok = Tokenizer(backend)
    assert tok.segmented
    for text in _overlapping_texts(1):
        assert tok.encode(text) == backend.encode(text).ids, text
        cut = text.find("<|U|>")
        if cut >= 0:
            cut += len("<|U|>")
            tail, _ = tok.encode_tail(text[cut:], starts_text=False)
            head = backend.encode(text[:cut], add_special_tokens=False).ids
            assert head + tail == backend.encode(text, add_special_tokens=False).ids, text


def test_tokens_matched_on_the_normalized_text_turn_the_cache_off_under_a_normalizer():
    backend = _with_normalized_tokens({"type": "NFC"})
    tok = Tokenizer(backend)
    assert not tok.segmented
    for text in _overlapping_texts(2)[:50]:
        assert tok.encode(text) == backend.encode(text).ids, text
