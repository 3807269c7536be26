"""A model's tokenizer, loaded as transformers/vLLM load it, with a segment cache.

Loading: ``tokenizer.json`` through the ``tokenizers`` library plus ``tokenizer_config.json``
(special tokens, ``chat_template``), the files of a Hugging Face model directory. As with
transformers' generic ``TokenizersBackend`` (5.x), tokenizer.json's post-processor decides
which special tokens ``add_special_tokens`` adds (``add_bos_token`` in the config does not
change it); truncation and padding are off.

Segment cache: ``tokenizers`` first splits the input on added tokens (``<|im_start|>``, ...)
and then normalises, pre-tokenises and runs the model on each piece independently. So the ids
of a text are the concatenation of the ids of its pieces, and a chat history that is resent
every turn consists mostly of pieces seen before. ``encode`` splits on the added tokens
(leftmost-longest, like the library), looks each piece up in a bounded LRU and encodes only the
new ones; the post-processor's fixed prefix/suffix (e.g. BOS) is added around the result. The
cache is used only when it is provably equivalent: every added token is matched on the raw text
(``normalized=False``) with no ``lstrip``/``rstrip``/``single_word`` and the post-processor
adds a fixed prefix/suffix; otherwise ``encode`` calls the library directly.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

SPECIAL_TOKEN_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TokenizerError(ValueError):
    """The tokenizer directory is missing or malformed."""


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
        segment_cache_size: int = 8192,
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
        self.segment_cache_size = segment_cache_size
        self._segments: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._splitter, self._added_ids = self._added_token_splitter()
        self._specials_prefix, self._specials_suffix = self._post_processor_affixes()
        self.segment_hits = 0
        self.segment_misses = 0

    @classmethod
    def from_dir(cls, path: str | Path, *, segment_cache_size: int = 8192) -> Tokenizer:
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
        return cls(backend, config, segment_cache_size=segment_cache_size, name=str(directory))

    @property
    def chat_template(self) -> str | None:
        template = self.config.get("chat_template")
        if isinstance(template, str):
            return template
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            default = named.get("default")
            return default if isinstance(default, str) else None
        return None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` as in ``tokenizer(text, ...)``)."""
        if self._splitter is None or self.segment_cache_size == 0:
            return self.encode_uncached(text, add_special_tokens=add_special_tokens)
        ids: list[int] = list(self._specials_prefix) if add_special_tokens else []
        self._encode_pieces(ids, text, None)
        if add_special_tokens:
            ids.extend(self._specials_suffix)
        return ids

    @property
    def segmented(self) -> bool:
        """Whether ``encode`` works piece by piece (so ``encode_tail`` may be used)."""
        return self._splitter is not None and self.segment_cache_size > 0

    @property
    def max_added_token_chars(self) -> int:
        """The longest added token: how far past a position the split looks to decide it."""
        return max(map(len, self._added_ids), default=0)

    def encode_tail(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """``encode(text, add_special_tokens=False)`` plus, after each added token, the
        (character offset, number of ids so far). For a ``segmented`` tokenizer only.

        Since every piece is encoded alone, the ids of ``prefix + text`` are the ids of
        ``prefix`` followed by these whenever ``prefix`` ends where the split of the whole
        text ends an added token (``kvgate.router.core.reuse`` relies on this)."""
        if not self.segmented:
            raise TokenizerError("encode_tail needs a tokenizer that splits on added tokens")
        ids: list[int] = []
        ends: list[tuple[int, int]] = []
        self._encode_pieces(ids, text, ends)
        return ids, ends

    def _encode_pieces(self, ids: list[int], text: str, ends: list[tuple[int, int]] | None) -> None:
        added = self._added_ids
        cache = self._segments
        assert self._splitter is not None
        position = 0
        # The splitter has one capturing group: pieces alternate text, added token, text, ...
        pieces = self._splitter.split(text)
        for index, piece in enumerate(pieces):
            if index % 2:
                ids.append(added[piece])
                if ends is not None:
                    position += len(piece)
                    ends.append((position, len(ids)))
            elif piece:
                segment = cache.get(piece)
                if segment is None:
                    segment = self._encode_segment(piece)
                else:
                    cache.move_to_end(piece)
                    self.segment_hits += 1
                ids.extend(segment)
                position += len(piece)

    def encode_uncached(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_id(self, token: str) -> int | None:
        value: int | None = self.backend.token_to_id(token)
        return value

    def _encode_segment(self, segment: str) -> tuple[int, ...]:
        cache = self._segments
        self.segment_misses += 1
        ids = tuple(self.backend.encode(segment, add_special_tokens=False).ids)
        cache[segment] = ids
        if len(cache) > self.segment_cache_size:
            cache.popitem(last=False)
        return ids

    def _segments_are_independent(self) -> bool:
        """Whether encoding pieces separately is provably the same as encoding the text.

        Pre-tokenizers such as Metaspace with ``prepend_scheme="first"`` (and ``Prepend``
        normalizers) treat the first piece of a text differently, so they disable the cache.
        """
        spec = json.loads(self.backend.to_str())
        text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
        return "Metaspace" not in text and "Prepend" not in text

    def _added_token_splitter(self) -> tuple[re.Pattern[str] | None, dict[str, int]]:
        if not self._segments_are_independent():
            return None, {}
        added = self.backend.get_added_tokens_decoder()
        contents: dict[str, int] = {}
        for token_id, token in added.items():
            if token.normalized or token.lstrip or token.rstrip or token.single_word:
                return None, {}
            contents[token.content] = token_id
        if not contents:
            return None, {}
        # Longest first: at one position the longest added token wins, as in the library.
        alternatives = sorted(contents, key=len, reverse=True)
        pattern = "|".join(re.escape(a) for a in alternatives)
        return re.compile(f"({pattern})"), contents

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
                    return prefix, suffix
        self._splitter = None  # not a fixed prefix/suffix: never use the segment cache
        return (), ()
