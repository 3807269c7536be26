"""Read a request body and parse it into a JSON object, safely, before anything else sees it.

Every check runs on bytes, without recursion, in C-speed passes:

1. **Size**: a declared `content-length` over `max_body_bytes` is a 413 before a byte is read;
   so is a (chunked) body that grows past it while arriving.
2. **Text**: the body must be UTF-8 (RFC 8259); anything else is a 400.
3. **Nesting depth**: Python's `json`, the chat-template renderer and the session digest all
   recurse per level, and fail with `RecursionError` near 1,000 levels. `nesting_problem` finds
   the depth without recursing, in C-speed passes: the escapes `\\\\` and `\\"` are removed (the
   only ones that move string boundaries), every byte but `"[]{}` is deleted, and over what is
   left numpy computes which bytes lie inside strings (quote-count parity: brackets in prompts
   are text, not structure) and the running depth (a prefix sum of +1/-1), in 1 MiB slices so
   that memory stays small; a 16 MB body of brackets or strings costs tens of milliseconds.
   Deeper than `max_depth` is a 400 naming the limit. Two counts skip all this for nearly every
   real body (fewer brackets than the limit).
4. **Lone surrogates**: `"\\ud800"` is valid JSON but not encodable text; it would fail later
   in hashing or tokenizing. A body with a `\\uD8xx`-`\\uDFxx` escape is re-encoded once to
   check (paired surrogates, i.e. escaped emoji, are fine).

A client that goes away while its body is being read raises `ClientDisconnected`: the app
counts it and logs one DEBUG line, since it is the client's doing, not an error of the router.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np

from kvgate.router.core.errors import RouterError, bad_request

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_TO_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_QUOTE, _OPEN, _CLOSE = ord('"'), ord("("), ord(")")
_SLICE_BYTES = 1 << 20
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class ClientDisconnected(Exception):
    """The client closed its connection before its request body was read."""


async def read_body(receive: Receive, declared_length: str | None, limit: int) -> bytes:
    """The whole request body, at most `limit` bytes (else a 413)."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def parse_json_object(raw: bytes, max_depth: int) -> dict[str, Any]:
    """`raw` as a JSON object; a 400 (OpenAI-shaped) for anything that is not a safe one."""
    if not raw:
        raise bad_request("request body is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8: {exc}", code="invalid_utf8") from None
    problem = nesting_problem(raw, max_depth)
    if problem == "deep":
        raise bad_request(
            f"request body nests arrays/objects deeper than {max_depth} levels",
            code="json_too_deep",
        )
    if problem == "unbalanced":
        raise bad_request("request body is not valid JSON: unbalanced brackets")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) is not None:
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(
                "request body contains a lone UTF-16 surrogate escape (\\ud800-\\udfff)",
                code="invalid_unicode",
            ) from None
    return body


def nesting_problem(raw: bytes, max_depth: int) -> str | None:
    """`"deep"` if arrays/objects nest deeper than `max_depth`, `"unbalanced"` if the brackets
    outside strings cannot be JSON, else None (the body may still be invalid JSON otherwise)."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return None
    if b"\\" in raw:
        # Only two escapes move string boundaries; removing them left to right, `\\` first,
        # reads them exactly as a JSON parser does.
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = raw.translate(_TO_PARENS, _NOT_STRUCTURE)  # only `"`, `(` and `)` remain
    if structure.count(b"(") <= max_depth:
        return None
    depth = 0
    quotes = 0
    for start in range(0, len(structure), _SLICE_BYTES):
        size = min(_SLICE_BYTES, len(structure) - start)
        codes = np.frombuffer(structure, np.uint8, size, start)
        is_quote = codes == _QUOTE
        outside = ((np.cumsum(is_quote, dtype=np.int32) + quotes) & 1) == 0
        steps = (codes == _OPEN).view(np.int8) - (codes == _CLOSE).view(np.int8)
        running = np.cumsum(np.where(outside, steps, np.int8(0)), dtype=np.int32) + depth
        if running.min() < 0:
            return "unbalanced"
        if running.max() > max_depth:
            return "deep"
        depth = int(running[-1])
        quotes += int(is_quote.sum())
    return None


def _too_large(limit: int) -> RouterError:
    return RouterError(413, f"request body over {limit} bytes", code="body_too_large")
