"""What a model's tokenizer.json allows the segment cache to do, decided once at load.

``tokenizers`` splits a text on its added tokens and then normalises, pre-tokenizes and runs
the model on each piece alone, so a piece's ids do not depend on its neighbours, with one
exception: SentencePiece-style tokenizers prepend their space marker (``▁``) to a piece, and
some only to the first piece of a text. ``TokenizerShape`` says how a piece is encoded alone
and still gives the library's ids, and whether a long piece may be cut into parts.

**The text a piece is encoded as** (``lead``, ``piece_spec``): the tokenizer pieces are
encoded with (``piece_spec``: the model's own, or the same without the prepending) and what is
put before a piece's text first:

- no prepending (byte-level tokenizers; Metaspace with ``prepend_scheme`` "always" or
  "never": each piece is treated the same wherever it is): the piece as it is;
- a ``Prepend`` normaliser (Llama 2, Mistral v0.1: every non-empty piece gets ``▁``),
  together with ``Replace`` steps only: the piece is encoded without the ``Prepend`` step, with
  its string put before it by hand (so that the parts after the first of a cut piece, which
  the library does not prepend, are encoded by the same tokenizer);
- Metaspace with ``prepend_scheme`` "first" (Llama and Mistral converted without ``legacy``)
  and no normaliser: the library prepends ``▁`` only to the piece at the start of the text,
  unless it starts with a space or ``▁``. Pieces are encoded with "never", and the first one
  of a text gets the ``▁`` by hand.

Everything else that prepends (a ``Prepend`` among other normalisers, "first" after a
normaliser, which could turn a first character into a space) is not ``alone``: those texts
are tokenized whole, as before.

**Parts** (``cuts_at_spaces``): a long piece cut just before a space between two letters has
the ids of its parts where the pre-tokenizer always starts a pre-token at such a space and the
model encodes each pre-token alone, or where no model step can join the two sides:

- a byte-level pre-tokenizer: the GPT-2 regex, or a split on the Llama 3 (cl100k), Qwen 2 or
  o200k regex before a byte-level map, after a normaliser that maps characters alone (none,
  NFC/NFD/NFKC/NFKD, Lowercase), with a model that encodes each pre-token alone (BPE without
  dropout, WordPiece, WordLevel, Unigram);
- Metaspace with ``split``: every ``▁`` starts a pre-token (same normalisers and models);
- SentencePiece BPE over a whole piece (Metaspace without ``split``, or no pre-tokenizer after a
  ``Replace`` of the space by ``▁``, as in Llama 2 and Gemma): BPE without dropout,
  ``ignore_merges``, or subword affixes, whose space marker is in the vocabulary and none of
  whose merges joins a symbol not ending in the marker to one starting with it. BPE only ever
  merges two adjacent symbols, so a position no merge can join stays a boundary, and the
  merges on each side happen as they would alone.

The parts after the first start with the space, so they are never prepended to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Pre-tokenizer split patterns whose matches never cross a space between two letters and
# always start one at it (alternatives of letters, numbers, other symbols each with at most one
# leading non-letter, and runs of whitespace), as the models' tokenizer.json files spell them.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_PATTERN = (  # GPT-4o's o200k and gpt-oss: letter runs split by case, marks with letters
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_PATTERN = (  # Mistral's Tekken (NeMo, Small 3, ...): o200k without contractions
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK_V3_PATTERN = (  # its third split; the file has CR and LF themselves, not escapes
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)
DEEPSEEK_V3_NUMBERS = r"\p{N}{1,3}"
DEEPSEEK_V3_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
# Patterns of which no match crosses a space between two letters and one starts at it.
_SPACE_START_PATTERNS = frozenset(
    {LLAMA3_PATTERN, QWEN2_PATTERN, O200K_PATTERN, TEKKEN_PATTERN, DEEPSEEK_V3_PATTERN}
)
# Patterns that never match whitespace and look at nothing outside their match.
_SPACE_FREE_PATTERNS = frozenset({DEEPSEEK_V3_NUMBERS, DEEPSEEK_V3_CJK})
_PER_CHARACTER_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
_PER_PRE_TOKEN_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})


@dataclass(frozen=True)
class TokenizerShape:
    """How pieces between added tokens may be encoded alone (module doc)."""

    alone: bool
    """Whether a piece encoded alone (``lead_text``, ``piece_spec``) has the library's ids."""
    cuts_at_spaces: bool
    """Whether a long piece may be cut just before a space between two letters."""
    normalizes: bool = True
    """Whether the normaliser may change a text (False: none, or an empty sequence)."""
    lead: str = ""
    """What is put before a piece's text (``lead_text``)."""
    lead_first_only: bool = False
    """Only before the piece that starts a text, and not if it starts with a space or ``lead``."""
    piece_spec: dict[str, Any] | None = None
    """The tokenizer.json pieces are encoded with, where it is not the model's own."""

    def lead_text(self, piece: str, starts_text: bool) -> str:
        """The text a non-empty piece is encoded as (``starts_text``: at a text's offset 0)."""
        if not self.lead:
            return piece
        if not self.lead_first_only:
            return self.lead + piece
        if starts_text and not piece.startswith((" ", self.lead)):
            return self.lead + piece
        return piece


def tokenizer_shape(spec: dict[str, Any]) -> TokenizerShape:
    """The shape of a tokenizer from its (library-serialised) tokenizer.json."""
    normalizer = spec.get("normalizer")
    steps = _normalizer_steps(normalizer)
    pre = spec.get("pre_tokenizer") or {}
    prepends = [step for step in steps if step.get("type") == "Prepend"]
    if prepends:
        return _prepended(spec, steps, prepends[0])
    if _is_first_metaspace(pre):
        if steps:
            return TokenizerShape(alone=False, cuts_at_spaces=False)
        never = {**spec, "pre_tokenizer": {**pre, "prepend_scheme": "never"}}
        return TokenizerShape(
            alone=True,
            cuts_at_spaces=_cuts_at_spaces(spec, steps),
            normalizes=False,
            lead=str(pre.get("replacement", "▁")),
            lead_first_only=True,
            piece_spec=_without_added_tokens(never),
        )
    if _has_first_metaspace(pre):  # inside a sequence (T5 without `legacy`): not reproduced
        return TokenizerShape(alone=False, cuts_at_spaces=False)
    return TokenizerShape(
        alone=True, cuts_at_spaces=_cuts_at_spaces(spec, steps), normalizes=bool(steps)
    )


def _is_first_metaspace(pre: Any) -> bool:
    return (
        isinstance(pre, dict)
        and pre.get("type") == "Metaspace"
        and (pre.get("prepend_scheme") == "first")
    )


def _has_first_metaspace(pre: Any) -> bool:
    """A Metaspace prepending to the first piece only, at any depth of the pre-tokenizer."""
    if _is_first_metaspace(pre):
        return True
    steps = pre.get("pretokenizers") if isinstance(pre, dict) else None
    return isinstance(steps, list) and any(_has_first_metaspace(step) for step in steps)


def _without_added_tokens(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` for encoding pieces: the split on added tokens is done before (an added token
    starting with the lead, CodeLlama's ``▁<PRE>``, would match the lead put there by hand)."""
    return {**spec, "added_tokens": []}


def _normalizer_steps(normalizer: Any) -> list[dict[str, Any]]:
    if normalizer is None:
        return []
    steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        return [{"type": "unknown"}]
    return steps


def _prepended(
    spec: dict[str, Any], steps: list[dict[str, Any]], prepend: dict[str, Any]
) -> TokenizerShape:
    """A ``Prepend`` normaliser among ``Replace`` steps of the space only (Llama 2): its string
    put before each piece by hand, the rest of the normaliser unchanged. Since no step changes
    the prepended string, where the ``Prepend`` stood in the sequence makes no difference."""
    lead = prepend.get("prepend")
    others = [step for step in steps if step is not prepend]
    pre = spec.get("pre_tokenizer") or {}
    if (
        not isinstance(lead, str)
        or not lead
        or " " in lead
        or len(others) != len(steps) - 1
        or not all(_space_marker(step) is not None for step in others)
        # a piece encoded alone would be "first" to a Metaspace that prepends only there
        or _has_first_metaspace(pre)
    ):
        return TokenizerShape(alone=False, cuts_at_spaces=False)
    rest = {"type": "Sequence", "normalizers": others} if others else None
    piece_spec = _without_added_tokens({**spec, "normalizer": rest})
    return TokenizerShape(
        alone=True,
        cuts_at_spaces=_cuts_at_spaces(piece_spec, others),
        lead=lead,
        piece_spec=piece_spec,
    )


def _space_marker(step: dict[str, Any]) -> str | None:
    """For a ``Replace`` of the space by one character (``▁``): that character; else None."""
    content = step.get("content")
    if (
        step.get("type") == "Replace"
        and (step.get("pattern") or {}).get("String") == " "
        and isinstance(content, str)
        and len(content) == 1
    ):
        return content
    return None


def _cuts_at_spaces(spec: dict[str, Any], steps: list[dict[str, Any]]) -> bool:
    """Whether a piece's ids are the ids of its parts when it is cut just before a space
    between two letters (the module doc gives the argument). ``steps``: the normaliser's."""
    model = spec.get("model") or {}
    if model.get("dropout"):
        return False
    pre = spec.get("pre_tokenizer") or {}
    per_character = all(step.get("type") in _PER_CHARACTER_NORMALIZERS for step in steps)
    per_pre_token = model.get("type") in _PER_PRE_TOKEN_MODELS
    if pre.get("type") == "ByteLevel":
        return (
            per_character
            and per_pre_token
            and not pre.get("add_prefix_space")
            and bool(pre.get("use_regex", True))
        )
    if pre.get("type") == "Metaspace":
        if pre.get("split"):
            return per_character and per_pre_token
        return per_character and _bpe_never_joins_at(model, pre.get("replacement"))
    if not pre:  # SentencePiece BPE over the whole piece, the space replaced by its marker
        markers = {_space_marker(step) for step in steps if step.get("type") == "Replace"}
        others = [step for step in steps if step.get("type") != "Replace"]
        return (
            len(markers) == 1
            and None not in markers
            and all(step.get("type") in _PER_CHARACTER_NORMALIZERS for step in others)
            and _bpe_never_joins_at(model, next(iter(markers)))
        )
    return per_character and per_pre_token and _splits_at_spaces(pre)


def _splits_at_spaces(pre: dict[str, Any]) -> bool:
    """Splits on known patterns before a byte-level map (module doc): each split either starts
    a pre-token at the space without crossing it, or never touches whitespace; at least one
    of the first kind."""
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) < 2:
        return False
    *splits, byte_level = steps
    patterns = [
        (split.get("pattern") or {}).get("Regex")
        for split in splits
        if isinstance(split, dict)
        and split.get("type") == "Split"
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
    ]
    return (
        len(patterns) == len(splits)
        and all(p in _SPACE_START_PATTERNS or p in _SPACE_FREE_PATTERNS for p in patterns)
        and any(p in _SPACE_START_PATTERNS for p in patterns)
        and isinstance(byte_level, dict)
        and byte_level.get("type") == "ByteLevel"
        and not byte_level.get("add_prefix_space")
        and not byte_level.get("use_regex", True)
    )


def _bpe_never_joins_at(model: dict[str, Any], marker: Any) -> bool:
    """A BPE model over a whole piece that can never merge across ``…x|▁y…``: no merge joins
    a symbol that does not end with the space marker to one that starts with it."""
    if (
        model.get("type") != "BPE"
        or model.get("ignore_merges")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or not isinstance(marker, str)
        or len(marker) != 1
        or marker not in (model.get("vocab") or {})
    ):
        return False
    for merge in model.get("merges") or ():
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2:
            return False
        left, right = pair
        if right.startswith(marker) and not left.endswith(marker):
            return False
    return True
