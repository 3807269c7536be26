"""Approximate prefix keys for pools without a tokenizer: chained fixed-size character blocks.

As the Gateway API Inference Extension's prefix scorer does, the prompt text is cut into blocks
of ``block_chars`` characters (64 by default, roughly 16 tokens); only full blocks count, at
most ``max_blocks`` of them. Block ``i``'s key is ``blake2b(parent || utf8(block), 8 bytes)``,
chained from ``blake2b(model || 0 || cache_salt)``, so two requests share a key exactly when
they share the model, the salt and every character up to the end of that block. The keys are
8-byte ``BlockKey`` values for approximate (routing-history) directory entries; they never meet
vLLM's own keys.

The text of a request: a completion's ``prompt`` string (token-id prompts are written as their
decimal ids); a chat request's tools (canonical JSON) then each message as
``<|role|>\\ncontent\\n`` with tool calls as canonical JSON, which keeps the text of a resent
history stable turn after turn (an Anthropic Messages body's `system` after its tools, without
Claude Code's per-request billing header); a Responses API body's tools, instructions and input
items (`responses_text`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kvgate.prefix.hashing import BlockKey

APPROX_KEY_SIZE = 8
DEFAULT_BLOCK_CHARS = 64
CHARS_PER_TOKEN = 4.0
"""Rough characters per token, to express character blocks in tokens for the cost model."""


_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _canonical(value: Any) -> str:
    """`value` as JSON with sorted keys, without Anthropic's `cache_control` markers: what the
    approximate keys read of a structured field."""
    text = _CANONICAL.encode(value)
    if '"cache_control"' not in text:  # the usual case: no copy of `value` to make
        return text
    return _CANONICAL.encode(without_cache_control(value))


def without_cache_control(value: Any) -> Any:
    """`value` without Anthropic's `cache_control` markers, at any depth: they are no part of
    the prompt, and Claude Code moves its marker to the newest block every turn (kept, the
    block the marker left would key differently from the turn before)."""
    if isinstance(value, Mapping):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


CHARS_PER_ITEM = 64


class _Text:
    """A rendering, built until it holds `limit` characters or `limit` / `CHARS_PER_ITEM`
    items (messages, content parts, input items, tools; None: no limit): the keys read no
    further, so a body of millions of items is not rendered whole (3.5M one-character items
    took 8 s to render, of which 4 MiB were keyed). Only a rendering of items shorter than 64
    characters on average ends before its characters do. One structured value (a tool, a
    message's tool calls) is rendered whole, in one C call."""

    def __init__(self, limit: int | None) -> None:
        self.pieces: list[str] = []
        self.size = 0
        self.items = 0
        self.limit = limit
        self.max_items = None if limit is None else max(1, limit // CHARS_PER_ITEM)

    @property
    def full(self) -> bool:
        if self.limit is None:
            return False
        return self.size >= self.limit or self.items >= self.max_items  # type: ignore[operator]

    def add(self, piece: str, *, item: bool = False) -> None:
        self.pieces.append(piece)
        self.size += len(piece)
        self.items += item

    def text(self) -> str:
        return "".join(self.pieces)


def _add_content(out: _Text, content: Any) -> None:
    if content is None:
        return
    if isinstance(content, str):
        out.add(content)
    elif isinstance(content, list):
        for i, part in enumerate(content):
            if out.full:
                return
            if i:
                out.add("\n")
            if isinstance(part, str):
                out.add(part, item=True)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                out.add(part["text"], item=True)
            else:
                out.add(_canonical(part), item=True)
    else:
        out.add(_canonical(content))


def completion_text(body: Mapping[str, Any]) -> str | None:
    """A completion's text prompt (the first of a batch of texts); None for token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return None


def _add_message(out: _Text, message: Any) -> None:
    if not isinstance(message, Mapping):
        out.add(f"<|?|>\n{_canonical(message)}\n", item=True)
        return
    out.add(f"<|{message.get('role')}|>\n", item=True)
    _add_content(out, message.get("content"))
    out.add("\n")
    if message.get("tool_calls") and not out.full:
        out.add(_canonical(message["tool_calls"]) + "\n")


def _tools_text(body: Mapping[str, Any], max_tools: int | None = None) -> str:
    """The tools, the first `max_tools` of a list (None: all)."""
    tools = body.get("tools")
    if isinstance(tools, list) and max_tools is not None:
        tools = tools[:max_tools]
    return f"<|tools|>\n{_canonical(tools)}\n" if tools else ""


BILLING_HEADER = "x-anthropic-billing-header"
"""A system text block Claude Code sends with a hash of each request: vLLM drops it (it would
defeat prefix caching), and so do the keys."""


def system_text(body: Mapping[str, Any]) -> str:
    """An Anthropic Messages API body's top-level `system` (a string, or text blocks)."""
    system = body.get("system")
    if isinstance(system, str):
        return f"<|system|>\n{system}\n" if system else ""
    if not isinstance(system, list):
        return ""
    texts = [
        block["text"]
        for block in system
        if isinstance(block, Mapping)
        and isinstance(block.get("text"), str)
        and not block["text"].startswith(BILLING_HEADER)
    ]
    return f"<|system|>\n{''.join(texts)}\n" if texts else ""


def responses_text(body: Mapping[str, Any], max_chars: int | None = None) -> str:
    """A Responses API body: its tools, `instructions` as a system message, then each `input`
    item in order (a message as a chat message; a tool call, its output, reasoning, ... as
    canonical JSON), so an agent that resends its items extends the text of its last turn.
    Rendered up to about `max_chars` characters (None: whole)."""
    out = _Text(max_chars)
    out.add(_tools_text(body, out.max_items))
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.add(f"<|system|>\n{instructions}\n")
    items = body.get("input")
    if isinstance(items, str):
        out.add(f"<|user|>\n{items}\n")
    elif isinstance(items, list):
        for item in items:
            if out.full:
                break
            if isinstance(item, Mapping) and "role" in item:
                _add_message(out, item)
            else:
                kind = item.get("type") if isinstance(item, Mapping) else None
                out.add(f"<|{kind}|>\n{_canonical(item)}\n", item=True)
    return out.text()


def request_text(body: Mapping[str, Any], max_chars: int | None = None) -> str:
    """A stable text rendering of a completion, chat, Anthropic Messages or Responses API request
    body, for approximate keys; up to about `max_chars` characters (None: whole)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = _Text(max_chars)
        out.add(_tools_text(body, out.max_items) + system_text(body))
        for message in messages:
            if out.full:
                break
            _add_message(out, message)
        return out.text()
    if "input" in body and not isinstance(body.get("prompt"), (str, list)):
        return responses_text(body, max_chars)  # (a Responses `prompt` is a template reference)
    text = completion_text(body)
    if text is not None:
        return text
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if max_chars is not None:
            prompt = prompt[:max_chars]  # an id is at least one character and a space
        return " ".join(str(token) for token in prompt)
    return ""


class ApproxBlockHasher:
    """Chained keys of fixed-size character blocks (no tokenizer needed)."""

    def __init__(
        self, block_chars: int = DEFAULT_BLOCK_CHARS, max_blocks: int | None = None
    ) -> None:
        if block_chars < 1:
            raise ValueError(f"block_chars must be >= 1, got {block_chars}")
        self.block_chars = block_chars
        self.max_blocks = max_blocks

    @property
    def max_chars(self) -> int | None:
        """The characters of a rendering the keys read (None: all)."""
        return None if self.max_blocks is None else self.max_blocks * self.block_chars

    @property
    def tokens_per_block(self) -> float:
        return self.block_chars / CHARS_PER_TOKEN

    def root(self, model: str = "", cache_salt: str | None = None) -> bytes:
        seed = f"{model}\0{cache_salt or ''}".encode()
        return hashlib.blake2b(seed, digest_size=APPROX_KEY_SIZE).digest()

    def hash_text(
        self, text: str, *, model: str = "", cache_salt: str | None = None
    ) -> list[BlockKey]:
        size = self.block_chars
        count = len(text) // size
        if self.max_blocks is not None:
            count = min(count, self.max_blocks)
        parent = self.root(model, cache_salt)
        blake = hashlib.blake2b
        keys: list[BlockKey] = []
        for start in range(0, count * size, size):
            parent = blake(
                parent + text[start : start + size].encode(), digest_size=APPROX_KEY_SIZE
            ).digest()
            keys.append(parent)
        return keys

    def hash_request(
        self, body: Mapping[str, Any], *, model: str = "", cache_salt: str | None = None
    ) -> list[BlockKey]:
        text = request_text(body, self.max_chars)
        return self.hash_text(text, model=model, cache_salt=cache_salt)
