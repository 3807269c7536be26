"""Where two requests' prompts stop sharing a prefix, in tokens, blocks and request fields.

Two views of the same question ("why did this turn miss the cache?"):

- **Tokens**: the length of the common prefix of the two prompts' token ids (exact, from the
  model's tokenizer and chat template) or of their approximate texts (characters, when no
  tokenizer is configured), and how many full KV blocks that is.
- **Fields**: the first field, in the order fields reach the prompt, whose value differs:
  ``chat_template``, ``tools``, ``messages[i]`` (``role``, ``content`` with a character offset,
  ``name``, ``tool_calls``, ``tool_call_id``, ``reasoning``), then ``documents``,
  ``chat_template_kwargs``, ``add_generation_prompt``; for completions ``prompt`` (character or
  token index). When every message of A reappears unchanged at the start of B, B *extends* A
  (the normal next turn of a session) and nothing broke.

``diff_requests`` is pure; the router calls it once per session turn with the previous turn's
body, and already-computed token ids can be passed in to avoid tokenizing twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kvgate.prefix.approx import request_text

if TYPE_CHECKING:  # only called through: diffs without a tokenizer need no `tokenizers`
    from kvgate.prefix.prompt import RequestTokenizer

DiffKind = Literal["identical", "extends", "diverges"]
_CHUNK = 256
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning")
_CHAT_TAIL_FIELDS = ("documents", "chat_template_kwargs", "add_generation_prompt")
FIELD_NAMES = frozenset(
    ("chat_template", "tools", "messages", *_MESSAGE_FIELDS, *_CHAT_TAIL_FIELDS, "prompt")
) | {"input", "instructions", "system"}
"""The field names a `FieldDifference.path` ends in (its `[index]` cut off), except a message's
other keys: those the client chooses, so they are no bounded set (e.g. of metric labels)."""


@dataclass(frozen=True, slots=True)
class FieldDifference:
    """The first request field whose value differs, with a character offset for strings."""

    path: str
    char_offset: int | None = None
    a_excerpt: str = ""
    b_excerpt: str = ""


@dataclass(frozen=True, slots=True)
class PrefixDiff:
    kind: DiffKind
    unit: Literal["tokens", "chars"]
    common: int
    """Length of the common prefix in ``unit``."""
    common_blocks: int
    block_size: int
    lengths: tuple[int, int]
    field: FieldDifference | None


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the common prefix; compares in chunks so long equal prefixes stay cheap."""
    limit = min(len(a), len(b))
    start = 0
    while start + _CHUNK <= limit and a[start : start + _CHUNK] == b[start : start + _CHUNK]:
        start += _CHUNK
    while start < limit and a[start] == b[start]:
        start += 1
    return start


def _excerpt(value: Any, offset: int, width: int = 40) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text[max(0, offset - 10) : offset + width]


def _differ(path: str, a: Any, b: Any) -> FieldDifference:
    if isinstance(a, str) and isinstance(b, str):
        offset = common_prefix_length(a, b)
        return FieldDifference(path, offset, _excerpt(a, offset), _excerpt(b, offset))
    return FieldDifference(path, None, _excerpt(a, 0), _excerpt(b, 0))


def _message_difference(path: str, a: Any, b: Any) -> FieldDifference | None:
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None if a == b else _differ(path, a, b)
    for name in (*_MESSAGE_FIELDS, *sorted((set(a) | set(b)) - set(_MESSAGE_FIELDS))):
        if a.get(name) != b.get(name):
            return _differ(f"{path}.{name}", a.get(name), b.get(name))
    return None


# Where a prompt's items are, with the fields rendered before and after them: chat messages
# (Anthropic's with a top-level `system`), and a Responses API body's list of input items.
_ITEM_LISTS = (
    ("messages", ("chat_template", "tools", "system"), _CHAT_TAIL_FIELDS),
    ("input", ("tools", "instructions"), ()),
)


def first_difference(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> tuple[DiffKind, FieldDifference | None]:
    """The first differing field of two request bodies (chat, completion or Responses API), in
    prompt order."""
    for key, heads, tails in _ITEM_LISTS:
        a_items, b_items = a.get(key), b.get(key)
        if not (isinstance(a_items, list) and isinstance(b_items, list)):
            continue
        for name in heads:
            if a.get(name) != b.get(name):
                return "diverges", _differ(name, a.get(name), b.get(name))
        for index, (ia, ib) in enumerate(zip(a_items, b_items, strict=False)):
            difference = _message_difference(f"{key}[{index}]", ia, ib)
            if difference is not None:
                return "diverges", difference
        if len(a_items) != len(b_items):
            index = min(len(a_items), len(b_items))
            path = f"{key}[{index}]"
            if len(a_items) < len(b_items):
                return "extends", FieldDifference(path, None, "", _excerpt(b_items[index], 0))
            return "diverges", FieldDifference(path, None, _excerpt(a_items[index], 0), "")
        for name in tails:
            if a.get(name) != b.get(name):
                return "diverges", _differ(name, a.get(name), b.get(name))
        return "identical", None
    if "input" in a and "input" in b and not isinstance(a.get("prompt"), (str, list)):
        for name in ("tools", "instructions", "input"):
            if a.get(name) != b.get(name):
                return "diverges", _differ(name, a.get(name), b.get(name))
        return "identical", None
    a_prompt, b_prompt = a.get("prompt"), b.get("prompt")
    if a_prompt == b_prompt:
        return "identical", None
    if isinstance(a_prompt, str) and isinstance(b_prompt, str):
        difference = _differ("prompt", a_prompt, b_prompt)
        kind: DiffKind = "extends" if b_prompt.startswith(a_prompt) else "diverges"
        return kind, difference
    if isinstance(a_prompt, list) and isinstance(b_prompt, list):
        index = common_prefix_length(a_prompt, b_prompt)
        kind = "extends" if index == len(a_prompt) else "diverges"
        return kind, FieldDifference(f"prompt[{index}]", None)
    return "diverges", _differ("prompt", a_prompt, b_prompt)


def _token_ids(requests: RequestTokenizer, body: Mapping[str, Any]) -> list[int]:
    if isinstance(body.get("messages"), list):
        return requests.chat_token_ids(body)
    return requests.completion_token_ids(body)[0]


def diff_requests(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    requests: RequestTokenizer | None = None,
    block_size: int = 16,
    approx_block_chars: int = 64,
    a_token_ids: Sequence[int] | None = None,
    b_token_ids: Sequence[int] | None = None,
) -> PrefixDiff:
    """Common prefix of two requests and the first differing field (raises PromptError).
    Responses and Anthropic Messages bodies are compared as their keyed text, as the router
    keys them, even with a tokenizer."""
    kind, field = first_difference(a, b)
    if a_token_ids is None and b_token_ids is None and (_converted(a) or _converted(b)):
        requests = None  # the engine converts these to chat its own way: compared as text
    if requests is not None or (a_token_ids is not None and b_token_ids is not None):
        ids_a = a_token_ids if a_token_ids is not None else _token_ids(_need(requests), a)
        ids_b = b_token_ids if b_token_ids is not None else _token_ids(_need(requests), b)
        common = common_prefix_length(ids_a, ids_b)
        return PrefixDiff(
            kind,
            "tokens",
            common,
            common // block_size,
            block_size,
            (len(ids_a), len(ids_b)),
            field,
        )
    text_a, text_b = request_text(a), request_text(b)
    common = common_prefix_length(text_a, text_b)
    return PrefixDiff(
        kind,
        "chars",
        common,
        common // approx_block_chars,
        approx_block_chars,
        (len(text_a), len(text_b)),
        field,
    )


def _converted(body: Mapping[str, Any]) -> bool:
    """A Responses API body (`input`) or an Anthropic Messages one (a top-level `system`)."""
    return "system" in body or ("input" in body and not isinstance(body.get("prompt"), (str, list)))


def _need(requests: RequestTokenizer | None) -> RequestTokenizer:
    if requests is None:
        raise ValueError("token ids for both requests, or a RequestTokenizer, are needed")
    return requests
