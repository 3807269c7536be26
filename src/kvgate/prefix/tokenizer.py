"""A model's tokenizer, loaded as transformers/vLLM load it, with a segment cache.

Loading: ``tokenizer.json`` through the ``tokenizers`` library plus ``tokenizer_config.json``
(special tokens, ``chat_template``), the files of a Hugging Face model directory. As with
transformers' generic ``TokenizersBackend`` (5.x), tokenizer.json's post-processor decides
which special tokens ``add_special_tokens`` adds (``add_bos_token`` in the config does not
change it); truncation and padding are off.

Encoding goes through ``encode_batch_fast``, which gives the same ids as ``encode`` but runs
without the GIL (``encode`` holds it for the whole call: a 3 MB text froze every other thread
for 2.9 s), so a large prompt tokenized in a worker thread leaves the event loop running.

Segment cache: ``tokenizers`` first splits the input on added tokens (``<|im_start|>``, ...)
and then normalises, pre-tokenises and runs the model on each piece independently. So the ids
of a text are the concatenation of the ids of its pieces, and a chat history that is resent
every turn consists mostly of pieces seen before. ``encode`` splits on the added tokens
(leftmost-longest, like the library), looks each piece up in an LRU bounded in bytes, and
encodes the new ones in batches; the post-processor's fixed prefix/suffix (e.g. BOS) is added
around the result. The cache is used only when it is provably equivalent: every added token is
matched on the raw text (``normalized=False``) with no ``lstrip``/``rstrip``/``single_word``,
the post-processor adds a fixed prefix/suffix, and the tokenizer's rule for prepending its
space marker to a piece can be reproduced by hand (``kvgate.prefix.tokenizer_shape``: pieces
are then encoded by a copy of the tokenizer without the prepending, with the marker put before
the piece where the library puts it); otherwise ``encode`` encodes the whole text.

Long pieces (a document, a long system prompt or tool output: one piece between two added
tokens, or a whole completion prompt) are cut further, about every ``SUBPIECE_CHARS``
characters, just before a space between two letters, where ``tokenizer_shape`` proves that the
same as encoding the piece whole (byte-level pre-tokenizers, Metaspace with ``split``,
SentencePiece BPE whose merges never join across such a space). Each cut is the first such
space at least ``SUBPIECE_CHARS`` after the previous one, so it depends only on the text before
it: two prompts that share a long document share its parts, and the second re-encodes only the
part where they differ (a 150,000-character document asked about again: the cost of ~4,000
characters instead of all of it). The parts of one piece are encoded in one batch, which the
library spreads over its threads.

Length limit: with ``max_tokens``, ``encode`` raises ``PromptTooLong`` as soon as the text is
known to have more tokens: first from its length alone (``token_bound.max_chars_per_token``),
then before each batch of new pieces (tokens so far plus the bound on the rest), from the
token count of each batch before its ids are turned into Python objects, and, for a text (or
piece) longer than ``token_count.count_first_above(max_tokens)`` characters, from a count
chunk by chunk (``token_count.at_least``) before it is tokenized whole. So a prompt far over
the limit costs no tokenization, none costs more than what could still fit, and the library's
transient memory (170-300 bytes per character tokenized at once) stays bounded.

Ids are canonical: every id is the one shared ``int`` object of its value (``_ints``), so the
caches hold 8 bytes per token instead of 36 (a fresh ``int`` is 28 bytes). The caches are safe
for concurrent use from several threads (a lock held only around dictionary updates).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from kvgate.prefix import token_count
from kvgate.prefix.added_token_split import AddedTokenSplit
from kvgate.prefix.segment_cache import SegmentCache
from kvgate.prefix.token_bound import max_chars_per_token
from kvgate.prefix.token_count import LETTER_SPACE_LETTER
from kvgate.prefix.tokenizer_shape import tokenizer_shape

SPECIAL_TOKEN_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

DEFAULT_SEGMENT_CACHE_BYTES = 64 << 20
_BATCH_CHARS = 1 << 18  # new pieces are encoded in batches of about this many characters
_CANON_CHUNK = 1 << 16  # ids made canonical per C call (each call holds the GIL)
SUBPIECE_CHARS = 4096  # a long piece is cut about this often, where provably the same
CUT_WINDOW_CHARS = 1 << 16  # how far past that a cut is looked for before cutting stops


class TokenizerError(ValueError):
    """The tokenizer directory is missing or malformed."""


class PromptTooLong(ValueError):
    """The text has more than ``limit`` tokens: ``at_least`` (the exact count if ``exact``)."""

    def __init__(self, limit: int, at_least: int, *, exact: bool = False) -> None:
        count = f"{at_least}" if exact else f"at least {at_least}"
        super().__init__(f"{count} tokens, over the limit of {limit}")
        self.limit = limit
        self.at_least = at_least
        self.exact = exact


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or a serialised AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class Tokenizer:
    """Token ids exactly as transformers (and so vLLM) compute them for a model directory."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        config: dict[str, Any] | None = None,
        *,
        segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES,
        name: str = "",
    ) -> None:
        self.backend = backend
        self.config = dict(config or {})
        self.name = name
        self.special_tokens_map: dict[str, str] = {}
        for attr in SPECIAL_TOKEN_ATTRIBUTES:
            text = _token_text(self.config.get(attr))
            if text is not None:
                self.special_tokens_map[attr] = text
        backend.no_truncation()
        backend.no_padding()
        self.segments = SegmentCache(segment_cache_bytes)
        spec = json.loads(backend.to_str())
        added_tokens = backend.get_added_tokens_decoder()
        self.max_chars_per_token: int | None = max_chars_per_token(
            spec, (t.content for t in added_tokens.values())
        )
        """The most input characters one token covers (None: no provable bound)."""
        size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self._ints: tuple[int, ...] = tuple(range(size))
        self.shape = tokenizer_shape(spec)
        """How pieces are encoded alone, and whether long ones are cut (module doc)."""
        self.cuts_at_spaces = self.shape.cuts_at_spaces
        self._piece_backend = (
            tokenizers.Tokenizer.from_str(json.dumps(self.shape.piece_spec))
            if self.shape.piece_spec is not None
            else backend
        )
        self._splitter, self._added_ids = self._added_token_splitter(added_tokens)
        self._affixes_fixed = True  # cleared where the post-processor adds no fixed affixes
        self._specials_prefix, self._specials_suffix = self._post_processor_affixes()

    @classmethod
    def from_dir(
        cls, path: str | Path, *, segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES
    ) -> Tokenizer:
        directory = Path(path)
        tokenizer_file = directory / "tokenizer.json"
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the library raises a bare Exception for bad files
            raise TokenizerError(f"cannot load {tokenizer_file}: {exc}") from None
        config: dict[str, Any] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.exists():
            try:
                loaded = json.loads(config_file.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise TokenizerError(f"cannot read {config_file}: {exc}") from None
            if not isinstance(loaded, dict):
                raise TokenizerError(f"{config_file} must hold a JSON object")
            config = loaded
        template_file = directory / "chat_template.jinja"
        if "chat_template" not in config and template_file.exists():
            config["chat_template"] = template_file.read_text()
        return cls(backend, config, segment_cache_bytes=segment_cache_bytes, name=str(directory))

    @property
    def chat_template(self) -> str | None:
        """The default chat template (a named set's "default")."""
        return self.chat_templates.get("default")

    @property
    def chat_templates(self) -> dict[str, str]:
        """The chat templates by name: one template is "default"; a named set
        (``[{"name": "default", "template": ...}, {"name": "tool_use", ...}]``) as given."""
        template = self.config.get("chat_template")
        if isinstance(template, str):
            return {"default": template}
        if isinstance(template, list):
            return {
                t["name"]: t["template"]
                for t in template
                if isinstance(t, dict)
                and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)
            }
        return {}

    @property
    def special_affixes(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The ids ``add_special_tokens`` puts before and after any text (e.g. ``(BOS,), ()``);
        None where the post-processor adds no fixed ones."""
        if not self._affixes_fixed:
            return None
        return self._specials_prefix, self._specials_suffix

    @property
    def segmented(self) -> bool:
        """Whether ``encode`` works piece by piece (so ``encode_tail`` may be used)."""
        return self._splitter is not None and self.segments.max_bytes > 0

    @property
    def max_added_token_chars(self) -> int:
        """How far past a position the split on added tokens looks to decide it."""
        return self._splitter.lookahead if self._splitter is not None else 0

    @property
    def segment_hits(self) -> int:
        return self.segments.hits

    @property
    def segment_misses(self) -> int:
        return self.segments.misses

    def check_length(self, chars: int, max_tokens: int | None, known: int = 0) -> None:
        """Raise ``PromptTooLong`` if ``known`` tokens plus ``chars`` more characters of text
        are provably more than ``max_tokens`` (None: no limit)."""
        per_token = self.max_chars_per_token
        if max_tokens is None or per_token is None:
            return
        at_least = known + -(-chars // per_token)
        if at_least > max_tokens:
            raise PromptTooLong(max_tokens, at_least)

    def encode(
        self, text: str, *, add_special_tokens: bool = True, max_tokens: int | None = None
    ) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` as in ``tokenizer(text, ...)``).
        Raises ``PromptTooLong`` when there would be more than ``max_tokens`` of them."""
        affixes = len(self._specials_prefix) + len(self._specials_suffix)
        known = affixes if add_special_tokens else 0
        self.check_length(len(text), max_tokens, known)
        if not self.segmented:
            ids = self._encode_whole(text, add_special_tokens, max_tokens)
            return ids
        ids = list(self._specials_prefix) if add_special_tokens else []
        self._encode_pieces(ids, text, None, max_tokens, known, starts_text=True)
        if add_special_tokens:
            ids.extend(self._specials_suffix)
        return ids

    def encode_tail(
        self,
        text: str,
        *,
        max_tokens: int | None = None,
        known: int = 0,
        starts_text: bool = True,
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``encode(text, add_special_tokens=False)`` plus, after each added token, the
        (character offset, number of ids so far). For a ``segmented`` tokenizer only.
        ``known``: ids of a prefix the caller has, counted towards ``max_tokens``;
        ``starts_text``: false when ``text`` follows that prefix.

        Since every piece is encoded alone, the ids of ``prefix + text`` are the ids of
        ``prefix`` followed by these whenever ``prefix`` ends where the split of the whole
        text ends an added token (``kvgate.router.core.reuse`` relies on this)."""
        if not self.segmented:
            raise TokenizerError("encode_tail needs a tokenizer that splits on added tokens")
        self.check_length(len(text), max_tokens, known)
        ids: list[int] = []
        ends: list[tuple[int, int]] = []
        self._encode_pieces(ids, text, ends, max_tokens, known, starts_text=starts_text)
        return ids, ends

    def encode_uncached(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The library's own ids for ``text``, without the segment cache."""
        return self._encode_whole(text, add_special_tokens, None)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_id(self, token: str) -> int | None:
        value: int | None = self.backend.token_to_id(token)
        return value

    # -- encoding ----------------------------------------------------------------------------

    def _count_first(
        self, text: str, limit: int | None, known: int, backend: tokenizers.Tokenizer
    ) -> None:
        """Refuse a long text by counting it chunk by chunk before tokenizing it whole."""
        if limit is None or len(text) <= token_count.count_first_above(limit):
            return
        at_least = token_count.at_least(backend, text, limit, known)
        if at_least > limit:
            raise PromptTooLong(limit, at_least)

    def _encode_whole(
        self, text: str, add_special_tokens: bool, max_tokens: int | None
    ) -> list[int]:
        affixes = len(self._specials_prefix) + len(self._specials_suffix)
        self._count_first(text, max_tokens, affixes if add_special_tokens else 0, self.backend)
        [encoding] = self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        if max_tokens is not None and len(encoding) > max_tokens:
            raise PromptTooLong(max_tokens, len(encoding), exact=True)
        ids: list[int] = encoding.ids
        return ids

    def _canonical(self, ids: list[int]) -> tuple[int, ...]:
        """``ids`` as the shared int objects; in chunks, so no single call holds the GIL long."""
        get = self._ints.__getitem__
        if len(ids) <= _CANON_CHUNK:
            return tuple(map(get, ids))
        out: list[int] = []
        for start in range(0, len(ids), _CANON_CHUNK):
            out.extend(map(get, ids[start : start + _CANON_CHUNK]))
        return tuple(out)

    def _encode_pieces(
        self,
        ids: list[int],
        text: str,
        ends: list[tuple[int, int]] | None,
        limit: int | None,
        known: int = 0,
        *,
        starts_text: bool,
    ) -> None:
        """Append the ids of ``text`` to ``ids`` (``known``: tokens counted towards ``limit``
        already, e.g. the post-processor's; ``starts_text``: ``text`` is at offset 0)."""
        assert self._splitter is not None
        # The splitter has one capturing group: pieces alternate text, added token, text, ...
        pieces = self._splitter.split(text)
        texts: list[str] = []  # what each text piece is encoded as, long ones in parts
        lengths: list[int] = []  # the characters of `text` each covers
        added_after: list[str | None] = []  # the added token after each (None: a cut, the end)
        lead_text = self.shape.lead_text
        for index in range(0, len(pieces), 2):
            parts = self._parts(pieces[index])
            lengths.extend(map(len, parts))
            if parts[0]:
                parts[0] = lead_text(parts[0], starts_text and index == 0)
            texts.extend(parts)
            added_after.extend([None] * len(parts))
            if index + 1 < len(pieces):
                added_after[-1] = pieces[index + 1]
        cache = self.segments
        found: list[tuple[int, ...] | None] = []
        missing: dict[str, list[int]] = {}  # new piece -> where it occurs in `texts`
        known += len(pieces) // 2  # one id per added token
        for index, piece in enumerate(texts):
            segment = cache.get(piece) if piece else ()
            found.append(segment)
            if segment is None:
                missing.setdefault(piece, []).append(index)
            else:
                known += len(segment)
        if limit is not None and known > limit:
            raise PromptTooLong(limit, known)
        if missing:
            self._encode_missing(missing, found, known, limit)
        added = self._added_ids
        position = 0
        for length, segment, token in zip(lengths, found, added_after, strict=True):
            assert segment is not None
            ids.extend(segment)
            position += length
            if token is not None:
                ids.append(added[token])
                if ends is not None:
                    position += len(token)
                    ends.append((position, len(ids)))

    def _parts(self, piece: str) -> list[str]:
        """``piece`` cut before a space between two letters about every ``SUBPIECE_CHARS``
        characters (each cut depends only on the text before it), where that is the same.
        A stretch of ``CUT_WINDOW_CHARS`` without such a space (minified JSON, base64, a run
        of spaces) ends the cutting: the rest is one part, and no search scans a whole huge
        piece character by character (~17 ns each, holding the GIL)."""
        if not self.cuts_at_spaces or len(piece) <= SUBPIECE_CHARS:
            return [piece]
        parts: list[str] = []
        start = 0
        while True:
            begin = start + SUBPIECE_CHARS
            found = LETTER_SPACE_LETTER.search(piece, begin, begin + CUT_WINDOW_CHARS)
            if found is None:
                break
            parts.append(piece[start : found.start()])
            start = found.start()
        parts.append(piece[start:])
        return parts

    def _encode_missing(
        self,
        missing: dict[str, list[int]],
        found: list[tuple[int, ...] | None],
        known: int,
        limit: int | None,
    ) -> None:
        """Encode the new pieces in batches (no GIL), checking the limit before converting.
        What one text adds to the segment cache is at most an eighth of it (its first pieces),
        as for one piece: a huge prompt in parts flushes no more than a huge piece did."""
        new = list(missing)
        remaining = sum(map(len, new))
        room = self.segments.max_bytes // 8
        start = 0
        while start < len(new):
            self.check_length(remaining, limit, known)
            end, chars = start, 0
            while end < len(new) and (end == start or chars + len(new[end]) <= _BATCH_CHARS):
                chars += len(new[end])
                end += 1
            batch = new[start:end]
            if len(batch) == 1:
                self._count_first(batch[0], limit, known, self._piece_backend)
            encodings = self._piece_backend.encode_batch_fast(batch, add_special_tokens=False)
            known += sum(map(len, encodings))
            if limit is not None and known > limit:
                raise PromptTooLong(limit, known)
            for piece, encoding in zip(batch, encodings, strict=True):
                segment = self._canonical(encoding.ids)
                size = self.segments.entry_bytes(piece, segment)
                if size <= room:
                    self.segments.put(piece, segment)
                    room -= size
                for index in missing[piece]:
                    found[index] = segment
            remaining -= chars
            start = end

    # -- analysis of the tokenizer (once, at load) -------------------------------------------

    def _added_token_splitter(
        self, added: dict[int, tokenizers.AddedToken]
    ) -> tuple[AddedTokenSplit | None, dict[str, int]]:
        """The split on added tokens, when encoding pieces alone is provably the same: no
        token strips or matches whole words only, and tokens matched on the normalised text
        only where that is the raw text."""
        if not self.shape.alone:
            return None, {}
        contents: dict[str, int] = {}
        raw: list[str] = []
        normalized: list[str] = []
        for token_id, token in added.items():
            if token.lstrip or token.rstrip or token.single_word:
                return None, {}
            if token.normalized and self.shape.normalizes:
                return None, {}
            (normalized if token.normalized else raw).append(token.content)
            contents[token.content] = token_id
        if not contents:
            return None, {}
        return AddedTokenSplit(raw, normalized), contents

    def _post_processor_affixes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the post-processor puts around any single sequence (e.g. ``(BOS,), ()``)."""
        probe = "a"
        bare = self.backend.encode(probe, add_special_tokens=False).ids
        full = self.backend.encode(probe, add_special_tokens=True).ids
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                prefix, suffix = tuple(full[:start]), tuple(full[start + len(bare) :])
                empty = self.backend.encode("", add_special_tokens=True).ids
                if list(prefix + suffix) == empty:
                    return self._canonical(list(prefix)), self._canonical(list(suffix))
        self._splitter = None  # not a fixed prefix/suffix: never use the segment cache
        self._affixes_fixed = False
        return (), ()
