"""Read `usage` (prompt tokens, cached tokens) out of responses on their way to the client.

Non-streaming responses are JSON with a top-level `usage`. Streaming responses are Server-Sent
Events; vLLM sends usage only when the client set `stream_options.include_usage`, in one last
chunk whose `choices` is empty. The router wants usage for every request (cached tokens are the
ground truth of its predictions), so when a streaming client did not ask for usage the router
asks for it and `SseUsageTap` strips that extra chunk back out: the client sees exactly the stream
it asked for. Events pass through as soon as they are complete; only a partial event at the end of
a network chunk is held back until the rest of it arrives.
"""

from __future__ import annotations

import re
from typing import Any

from kvgate import untrusted_json
from kvgate.router.core.learn import Usage

MAX_USAGE_TOKENS = 1 << 31
"""A token count above this (or below 0) in a pod's `usage` is nonsense: read as absent. Counts
feed metrics and estimates as floats, and JSON integers may have thousands of digits."""


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE_TOKENS:
        return value
    return None


def usage_from_obj(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=_count(usage.get("completion_tokens")) or 0,
    )


_EVENT_END = re.compile(rb"\r?\n\r?\n")


def usage_from_json_body(body: bytes) -> Usage | None:
    """Usage of a JSON response. vLLM writes `usage` after `choices`: parse only that object
    (a long completion's text is not decoded again); fall back to the whole body."""
    at = body.rfind(b'"usage"')
    if at > 0 and body[at - 1 : at] != b"\\":
        colon = body.find(b":", at + 7)
        try:
            value, _ = untrusted_json.raw_decode(body[colon + 1 :].decode().lstrip())
        except ValueError:  # UnicodeDecodeError and nesting too deep included
            value = None
        found = usage_from_obj({"usage": value})
        if found is not None:
            return found
    try:
        return usage_from_obj(untrusted_json.loads(body))
    except ValueError:
        return None


class SseUsageTap:
    """Feed upstream SSE bytes, forward what `feed` returns; `usage` holds the last usage seen."""

    __slots__ = ("_pending", "strip_usage_chunk", "usage")

    def __init__(self, *, strip_usage_chunk: bool) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.usage: Usage | None = None
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        # Events end with a blank line: "\n\n" (vLLM) or "\r\n\r\n" (other servers).
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if end == 0:
            self._pending = data
            return b""
        complete, self._pending = data[:end], data[end:]
        if b'"usage"' not in complete:
            return complete
        out: list[bytes] = []
        start = 0
        for match in _EVENT_END.finditer(complete):
            event = complete[start : match.end()]
            start = match.end()
            if b'"usage"' in event and self._inspect(event):
                continue
            out.append(event)
        out.append(complete[start:])
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        return rest

    def _inspect(self, event: bytes) -> bool:
        """Record usage from one event; True when the event should be dropped."""
        payload = b"".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
        try:
            obj = untrusted_json.loads(payload)
        except ValueError:
            return False
        usage = usage_from_obj(obj)
        if usage is None:
            return False
        self.usage = usage
        return self.strip_usage_chunk and obj.get("choices") == []
