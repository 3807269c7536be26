"""Length limits and concurrency of `Tokenizer`: refusing early, never changing an id."""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tokenizers

from kvgate.prefix import PromptTooLong, Tokenizer
from kvgate.prefix.token_bound import max_chars_per_token

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"
SPEC = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
WORDS = ["alpha", "beta", "gamma", "delta", "ünï", "漢字", "🙂", "  ", "\n", "x" * 30, "-" * 60]


class CountingBackend:
    """The real backend, counting the characters handed to the batch encoder."""

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        self._backend = backend
        self.encoded_chars = 0

    def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
        self.encoded_chars += sum(map(len, texts))
        return self._backend.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _counting(**kwargs: Any) -> tuple[Tokenizer, CountingBackend]:
    backend = CountingBackend(tokenizers.Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")))
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    return Tokenizer(backend, config, **kwargs), backend  # type: ignore[arg-type]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(words))


def _chat(rng: random.Random, messages: int, words: int) -> str:
    return (
        "".join(f"<|im_start|>user\n{_text(rng, words)}<|im_end|>\n" for _ in range(messages))
        + "<|im_start|>assistant\n"
    )


# -- the bound -------------------------------------------------------------------------------


def _spec(**parts: Any) -> dict[str, Any]:
    return {**SPEC, **parts}


def test_the_test_tokenizer_has_its_longest_entry_as_bound():
    longest = max(map(len, SPEC["model"]["vocab"]))
    assert Tokenizer.from_dir(TOKENIZER_DIR).max_chars_per_token == longest == 49


@pytest.mark.parametrize(
    ("normalizer", "factor"),
    [
        ({"type": "NFC"}, 4),
        ({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}, 4),
        ({"type": "Replace", "pattern": {"String": "  "}, "content": "▁"}, 2),
        ({"type": "Strip", "strip_left": True, "strip_right": True}, None),
        ({"type": "Replace", "pattern": {"String": "x"}, "content": ""}, None),
        ({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}, None),
        ({"type": "BertNormalizer", "clean_text": True}, None),
    ],
)
def test_normalizers_that_may_shrink_a_text_scale_or_void_the_bound(normalizer, factor):
    got = max_chars_per_token(_spec(normalizer=normalizer), [])
    assert got == (None if factor is None else 49 * factor)


@pytest.mark.parametrize(
    "pre_tokenizer",
    [{"type": "Whitespace"}, {"type": "WhitespaceSplit"}, {"type": "BertPreTokenizer"}],
)
def test_pre_tokenizers_that_drop_whitespace_have_no_bound(pre_tokenizer):
    assert max_chars_per_token(_spec(pre_tokenizer=pre_tokenizer), []) is None


def test_models_that_fuse_or_drop_unknown_characters_have_no_bound():
    plain = {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}
    bpe = SPEC["model"]
    assert max_chars_per_token(_spec(pre_tokenizer=plain), []) is None  # unknowns dropped
    fused = {**bpe, "unk_token": "<unk>", "fuse_unk": True}
    assert max_chars_per_token(_spec(pre_tokenizer=plain, model=fused), []) is None
    one_each = {**bpe, "unk_token": "<unk>", "fuse_unk": False}
    assert max_chars_per_token(_spec(pre_tokenizer=plain, model=one_each), []) == 49
    fallback = {**bpe, "byte_fallback": True}
    assert max_chars_per_token(_spec(pre_tokenizer=plain, model=fallback), []) == 49
    assert max_chars_per_token(_spec(model={"type": "WordPiece", "vocab": {}}), []) is None
    assert max_chars_per_token(SPEC, ["<" + "x" * 98 + ">"]) == 100  # a long added token


def test_no_text_has_fewer_tokens_than_the_bound_says():
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    per_token = tok.max_chars_per_token
    assert per_token is not None
    rng = random.Random(3)
    longest = max(SPEC["model"]["vocab"], key=len)
    texts = [_text(rng, rng.randint(1, 400)) for _ in range(100)]
    texts += [longest * 50, "-" * 10_000, "<|im_start|>" * 100, " " * 5000, _chat(rng, 5, 30)]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) >= math.ceil(len(text) / per_token), text[:40]


# -- refusing early --------------------------------------------------------------------------


def test_under_the_limit_the_ids_do_not_change(hf_tokenizer):
    rng = random.Random(4)
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    for _ in range(30):
        text = _chat(rng, rng.randint(1, 6), rng.randint(1, 80))
        expected = hf_tokenizer(text)["input_ids"]
        assert tok.encode(text, max_tokens=len(expected)) == expected
        with pytest.raises(PromptTooLong) as raised:
            tok.encode(text, max_tokens=len(expected) - 1)
        assert raised.value.limit == len(expected) - 1
        assert raised.value.at_least >= len(expected) - 1


def test_a_text_over_the_bound_is_refused_without_tokenizing():
    tok, backend = _counting()
    assert tok.max_chars_per_token is not None
    text = "y" * (1000 * tok.max_chars_per_token + 1)
    with pytest.raises(PromptTooLong) as raised:
        tok.encode(text, max_tokens=1000)
    assert backend.encoded_chars == 0
    assert raised.value.at_least > 1000 and not raised.value.exact


def test_only_what_can_still_fit_is_tokenized():
    tok, backend = _counting()
    rng = random.Random(5)
    text = _chat(rng, 400, 100)  # ~400 pieces of ~700 characters, ~90k tokens
    with pytest.raises(PromptTooLong):
        tok.encode(text, max_tokens=2000)
    # The limit is found within the first batch of new pieces (2^20 characters), and that
    # batch is encoded without turning its ids into Python objects.
    assert backend.encoded_chars < len(text)
    with pytest.raises(PromptTooLong):
        tok.encode_tail(text, max_tokens=2000)


def test_a_single_piece_is_counted_before_its_ids_are_converted():
    tok, _backend = _counting(segment_cache_bytes=0)  # not segmented: one whole encode
    text = _text(random.Random(6), 3000)
    count = len(tok.encode(text))
    with pytest.raises(PromptTooLong) as raised:
        tok.encode(text, max_tokens=count - 1)  # past the cheap bound: counted, exactly
    assert raised.value.exact and raised.value.at_least == count


# -- threads ---------------------------------------------------------------------------------


def test_encoding_a_large_text_leaves_other_threads_running():
    # `Tokenizer.encode` of the library holds the GIL for the whole call (about a second
    # here); kvgate's encode must let another thread run all along.
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    text = _text(random.Random(7), 300_000)
    gaps: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        started = time.perf_counter()
        ids = tok.encode(text)
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        thread.join(5)
    assert len(ids) > 300_000
    assert max(gaps) < max(0.25, elapsed / 3), (max(gaps), elapsed)


def test_concurrent_encodes_share_the_cache_and_stay_exact():
    tok = Tokenizer.from_dir(TOKENIZER_DIR, segment_cache_bytes=256 * 1024)
    rng = random.Random(8)
    system = f"<|im_start|>system\n{_text(rng, 300)}<|im_end|>\n"
    texts = [system + _chat(random.Random(i), rng.randint(1, 8), 40) for i in range(60)]
    expected = [tok.encode_uncached(t) for t in texts]
    errors: list[str] = []

    def work(offset: int) -> None:
        for round_ in range(3):
            for i in range(offset, len(texts), 4):
                if tok.encode(texts[i]) != expected[i]:
                    errors.append(f"text {i}, round {round_}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert tok.segment_hits > 0 and tok.segments.bytes <= 256 * 1024


# -- counting in chunks ----------------------------------------------------------------------


def test_chunk_counts_add_up_to_the_whole_and_bound_it_from_below():
    from kvgate.prefix import token_count

    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    rng = random.Random(9)
    texts = [_text(rng, 30_000), "ab" * 50_000, "é" * 30_000 + " x" * 10_000, _chat(rng, 20, 300)]
    for text in texts:
        whole = len(tok.encode_uncached(text, add_special_tokens=False))
        cuts = token_count.cut_positions(text, 4096)
        bounds = [0, *(c for c, _ in cuts), len(text)]
        chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
        counted = sum(len(tok.encode_uncached(c, add_special_tokens=False)) for c in chunks)
        if all(safe for _, safe in cuts):
            assert counted == whole, text[:30]  # letter-space-letter cuts change no token
        bound = token_count.at_least(tok.backend, text, 10**9, chunk_chars=4096)
        assert bound <= whole, text[:30]


def test_a_long_text_over_the_limit_is_counted_only_as_far_as_needed():
    tok, backend = _counting(segment_cache_bytes=0)
    text = _text(random.Random(10), 150_000)  # ~2 M characters, ~900 k tokens
    limit = len(text) // 49 + 1000  # passes the character bound: must be counted
    with pytest.raises(PromptTooLong) as raised:
        tok.encode(text, max_tokens=limit)
    assert backend.encoded_chars <= 2 * (1 << 18)  # one or two chunks, not the whole text
    assert limit < raised.value.at_least < len(tok.encode_uncached(text))


def test_letter_space_letter_is_a_space_between_two_letters_or_numbers():
    """The pattern (written to start at the space, for speed) finds exactly the spaces whose
    neighbours are both in `[^\\W\\d_]`: letters, and numbers that are not decimal digits."""
    import random

    from kvgate.prefix.token_count import LETTER_SPACE_LETTER

    def letter(char: str) -> bool:
        return char.isalnum() and not char.isdecimal()

    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice("a1_ é\u0301²½漢\n.") for _ in range(rng.randint(0, 16)))
        expected = [
            i
            for i in range(1, len(text) - 1)
            if text[i] == " " and letter(text[i - 1]) and letter(text[i + 1])
        ]
        assert [m.start() for m in LETTER_SPACE_LETTER.finditer(text)] == expected, repr(text)
