"""Read a request body and parse it into a JSON object, safely, before anything else sees it.

Every check runs on bytes, without recursion, in C-speed passes:

1. **Size**: a declared `content-length` over `max_body_bytes` is a 413 before a byte is read;
   so is a (chunked) body that grows past it while arriving.
2. **Nesting depth**: Python's `json`, the chat-template renderer and the session digest all
   recurse per level, and fail with `RecursionError` near 1,000 levels. `nesting_problem` finds
   the depth without recursing, with numpy over 1 MiB slices: the positions of quotes,
   backslashes and brackets; a quote after an odd run of backslashes is escaped (runs carried
   across slices); a bracket is structure when an even number of unescaped quotes precede it
   (brackets in prompts are text); the running depth is a prefix sum of +1/-1 over those.
   Deeper than `max_depth` is a 400 naming the limit. Two counts skip all this for nearly every
   small body (fewer brackets than the limit).
3. **Parsing**: `msgspec` (RFC 8259: UTF-8, no lone UTF-16 surrogate escapes, which would fail
   later in hashing or tokenizing). A body it refuses is read again by Python's `json` when it is
   at most `STRICT_JSON_ABOVE` (1 MiB): the errors say which rule the body broke (not UTF-8, a
   lone surrogate `"\\ud800"`, malformed), and `NaN`, `Infinity` and `1e400`, which vLLM's
   server accepts, are accepted. A larger body must be RFC 8259 JSON: re-reading it would hold
   the GIL for tens of milliseconds for each such request.

Bodies of `PARSE_IN_THREAD_BYTES` (256 KiB) or more are parsed in a worker thread: the numpy
passes release the GIL, so the event loop serves others meanwhile; `msgspec` holds it, but
decodes 2-3x faster than `json`, and only that is left of the pause (a 16 MB chat body held the
loop 36 ms with the stdlib parser, or 220 ms for 24 MB full of escapes; now 10-20 and ~30 ms).

A client that goes away while its body is being read raises `ClientDisconnected`: the app
counts it and logs one DEBUG line, since it is the client's doing, not an error of the router.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec
import numpy as np

from kvgate.router.core.errors import RouterError, bad_request

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN, _CLOSE = ord("{"), ord("}")
_UP, _DOWN = np.int8(1), np.int8(-1)
_SLICE_BYTES = 1 << 20
PARSE_IN_THREAD_BYTES = 1 << 18  # larger bodies are parsed in a worker thread
STRICT_JSON_ABOVE = 1 << 20  # larger bodies must be RFC 8259 JSON (no NaN, Infinity, 1e400)
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
    problem = nesting_problem(raw, max_depth)
    if problem == "deep":
        raise bad_request(
            f"request body nests arrays/objects deeper than {max_depth} levels",
            code="json_too_deep",
        )
    if problem == "unbalanced":
        raise bad_request("request body is not valid JSON: unbalanced brackets")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        if len(raw) > STRICT_JSON_ABOVE:
            raise _not_json(raw, str(exc)) from None
        body = _parse_with_json(raw)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


def _parse_with_json(raw: bytes) -> Any:
    """What Python's `json` makes of a body `msgspec` refused: the same errors as before, and
    the literals vLLM's server accepts beyond RFC 8259 (`NaN`, `Infinity`, `1e400`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8: {exc}", code="invalid_utf8") from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) is not None:
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(
                "request body contains a lone UTF-16 surrogate escape (\\ud800-\\udfff)",
                code="invalid_unicode",
            ) from None
    return body


def _not_json(raw: bytes, reason: str) -> RouterError:
    """A large body `msgspec` refused: not re-parsed (that would hold the GIL for each)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return bad_request(f"request body is not valid UTF-8: {exc}", code="invalid_utf8")
    return bad_request(f"request body is not valid JSON: {reason}")


def nesting_problem(raw: bytes, max_depth: int) -> str | None:
    """`"deep"` if arrays/objects nest deeper than `max_depth`, `"unbalanced"` if the brackets
    outside strings cannot be JSON, else None (the body may still be invalid JSON otherwise)."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return None
    everything = np.frombuffer(raw, np.uint8)
    depth = 0
    quotes = 0  # unescaped quotes so far: odd while inside a string
    run = 0  # backslashes ending the slices so far
    for start in range(0, len(raw), _SLICE_BYTES):
        codes = everything[start : start + _SLICE_BYTES]
        quote_at = np.flatnonzero(codes == _QUOTE)
        backslash_at = np.flatnonzero(codes == _BACKSLASH)
        if len(quote_at) and (run or len(backslash_at)):
            quote_at = quote_at[_unescaped(quote_at, backslash_at, run)]
        run = _trailing_run(backslash_at, len(codes), run)
        folded = codes | 0x20  # "[" -> "{", "]" -> "}", no other byte becomes either
        bracket_at = np.flatnonzero((folded == _OPEN) | (folded == _CLOSE))
        if not len(bracket_at):
            quotes += len(quote_at)
            continue
        inside = (np.searchsorted(quote_at, bracket_at) + quotes) & 1
        steps = np.where(folded[bracket_at[inside == 0]] == _OPEN, _UP, _DOWN)
        quotes += len(quote_at)
        if not len(steps):
            continue
        running = np.cumsum(steps, dtype=np.int64) + depth
        if running.min() < 0:
            return "unbalanced"
        if running.max() > max_depth:
            return "deep"
        depth = int(running[-1])
    return None


def _unescaped(quote_at: np.ndarray, backslash_at: np.ndarray, run: int) -> np.ndarray:
    """Which quotes are not escaped: those after an even run of backslashes (`run`: the
    backslashes ending the slices before, which a run starting at 0 continues)."""
    escaped: np.ndarray = (quote_at == 0) & (run % 2 == 1)  # after the carried run alone
    if len(backslash_at):
        # Where the run of consecutive backslashes holding each backslash starts.
        breaks = np.empty(len(backslash_at), bool)
        breaks[0] = True
        breaks[1:] = np.diff(backslash_at) != 1
        run_start = np.maximum.accumulate(np.where(breaks, backslash_at, -1))
        run_start[run_start == 0] = -run  # a run from the slice's start continues the carry
        last = np.maximum(np.searchsorted(backslash_at, quote_at) - 1, 0)  # the one before
        adjacent = backslash_at[last] == quote_at - 1
        escaped |= adjacent & ((quote_at - run_start[last]) % 2 == 1)
    return ~escaped


def _trailing_run(backslash_at: np.ndarray, size: int, run: int) -> int:
    """The backslashes ending this slice (continuing `run` if they fill it)."""
    if not len(backslash_at) or backslash_at[-1] != size - 1:
        return 0
    gaps = np.flatnonzero(np.diff(backslash_at) != 1)
    count = len(backslash_at) - (int(gaps[-1]) + 1 if len(gaps) else 0)
    return count + run if count == size else count


def _too_large(limit: int) -> RouterError:
    return RouterError(413, f"request body over {limit} bytes", code="body_too_large")
