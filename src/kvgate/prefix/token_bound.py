"""A cheap lower bound on a text's token count, from the tokenizer's definition alone.

To refuse a prompt longer than the engines' ``max_model_len`` before tokenizing all of it, the
router needs ``tokens(text) >= ceil(len(text) / max_chars_per_token)``. That holds when every
input character ends up in some token and no token covers more than ``max_chars_per_token``
input characters. ``max_chars_per_token`` proves it for the tokenizers in use today and gives
``None`` (no bound) for anything it cannot vouch for:

- Model: BPE in which every character gets a token: byte-level (the pre-tokenizer maps each
  byte to one of the 256 byte symbols of the vocabulary), ``byte_fallback``, or an
  ``unk_token`` without ``fuse_unk`` (one token per unknown character). A vocabulary entry of
  n characters then covers at most n input characters: a byte-level symbol stands for one byte
  and a character is at least one byte; ``▁`` stands for one space; ``<0x41>``-style fallback
  tokens cover one byte. WordPiece (one ``[UNK]`` for a long word), Unigram (fused unknowns)
  and WordLevel: no bound.
- Added tokens: one token each, ``len(content)`` characters (times the normalizer's factor,
  for those matched on normalized text).
- Pre-tokenizers that only split or map characters one to one: ByteLevel, Metaspace,
  Split/Punctuation (unless ``Removed``), Digits, UnicodeScripts, and sequences of them.
  Whitespace, WhitespaceSplit, BertPreTokenizer and CharDelimiterSplit drop characters.
- Normalizers, each with the factor by which it may shrink a text: NFD, NFKD, Lowercase,
  Prepend, ByteLevel: 1; NFC, NFKC: 4, since ``NFD(NFC(x)) = NFD(x)`` is at least as long as
  ``x`` and a composed character decomposes canonically into at most 4 code points; Replace of
  a literal string by a non-empty one: ``ceil(len(pattern) / len(content))``; a sequence: the
  product. Strip, StripAccents, BertNormalizer, Precompiled (SentencePiece) and regex
  replacements may delete characters: no bound.

The post-processor only adds tokens, so it never weakens the bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CANONICAL_DECOMPOSITION_MAX = 4
"""The most code points one character decomposes into canonically (U+1F82, Unicode 14)."""

_SPLITTING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}
_UNIT_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}


def _pre_tokenizer_keeps_text(spec: Mapping[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps_text(p) for p in spec.get("pretokenizers") or [])
    if kind in ("Split", "Punctuation"):
        return spec.get("behavior") != "Removed"
    return kind in _SPLITTING_PRE_TOKENIZERS


def _is_byte_level(spec: Mapping[str, Any] | None) -> bool:
    """A ByteLevel step (pre-tokenizer or normalizer) anywhere in ``spec``."""
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        parts = spec.get("pretokenizers") or spec.get("normalizers") or []
        return any(_is_byte_level(p) for p in parts)
    return spec.get("type") == "ByteLevel"


def _shrink_factor(spec: Mapping[str, Any] | None) -> int | None:
    """How many input characters one normalized character may stand for (None: unbounded)."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for part in spec.get("normalizers") or []:
            sub = _shrink_factor(part)
            if sub is None:
                return None
            factor *= sub
        return factor
    if kind in _UNIT_NORMALIZERS:
        return 1
    if kind in ("NFC", "NFKC"):
        return CANONICAL_DECOMPOSITION_MAX
    if kind == "Replace":
        pattern = spec.get("pattern") or {}
        literal = pattern.get("String") if isinstance(pattern, Mapping) else None
        content = spec.get("content")
        if not isinstance(literal, str) or not isinstance(content, str) or not content:
            return None
        return max(1, -(-len(literal) // len(content)))
    return None


def max_chars_per_token(spec: Mapping[str, Any], added_tokens: Iterable[str]) -> int | None:
    """The most input characters one token can cover, for a ``tokenizer.json`` document and
    its added tokens' contents; None when no such bound is provable (see the module doc)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    pre_tokenizer = spec.get("pre_tokenizer")
    if not _pre_tokenizer_keeps_text(pre_tokenizer):
        return None
    every_char_has_a_token = (
        _is_byte_level(pre_tokenizer)
        or _is_byte_level(spec.get("normalizer"))
        or bool(model.get("byte_fallback"))
        or (model.get("unk_token") is not None and not model.get("fuse_unk"))
    )
    if not every_char_has_a_token:
        return None
    factor = _shrink_factor(spec.get("normalizer"))
    if factor is None:
        return None
    vocab = model.get("vocab") or {}
    longest = max(map(len, vocab), default=1)
    longest_added = max(map(len, added_tokens), default=1)
    return max(longest, longest_added) * factor
