"""Read `usage` (prompt tokens, cached tokens) out of responses on their way to the client.

Non-streaming responses are JSON with a top-level `usage`. Streaming responses are Server-Sent
Events; a Responses API stream carries usage in its last event, an Anthropic Messages stream in
its `message_delta`; for chat and completions vLLM sends usage only when the client set
`stream_options.include_usage`, in one last chunk whose `choices` is empty. The router wants usage for every request (cached tokens are the
ground truth of its predictions), so when a streaming client did not ask for usage the router
asks for it and `SseUsageTap` strips that extra chunk back out: the client sees exactly the stream
it asked for. Events pass through as soon as they are complete; only a partial event at the end of
a network chunk is held back until the rest of it arrives.

A pod decides how long an event is, so the tap costs O(bytes fed) whatever it sends: each chunk is
searched for an event's end together with only the last 3 bytes held before it (a `\r\n\r\n` may
straddle two chunks), and an event still unfinished past `max_event_bytes` fails the stream
(`UpstreamError`, handled as any stream that breaks) instead of growing without end.
"""

from __future__ import annotations

import re
from typing import Any

from kvgate import untrusted_json
from kvgate.router.core.learn import Usage
from kvgate.router.http.upstream import MAX_READ_ALL_BYTES, UpstreamError

MAX_USAGE_TOKENS = 1 << 31
"""A token count above this (or below 0) in a pod's `usage` is nonsense: read as absent. Counts
feed metrics and estimates as floats, and JSON integers may have thousands of digits."""


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE_TOKENS:
        return value
    return None


def usage_from_obj(obj: Any) -> Usage | None:
    """The `usage` of an answer or a stream's event: chat and completions name its counts
    `prompt_tokens`/`completion_tokens`, the Responses API `input_tokens`/`output_tokens` (its
    stream carries them in the final event's `response`), and Anthropic's Messages API
    `input_tokens` (the uncached ones), `cache_read_input_tokens`, `output_tokens`."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), dict):
        usage = obj["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    names = ("prompt", "completion") if "prompt_tokens" in usage else ("input", "output")
    prompt = _count(usage.get(f"{names[0]}_tokens"))
    if prompt is None:
        return None
    details = usage.get(f"{names[0]}_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if "cache_read_input_tokens" in usage:  # Anthropic: `input_tokens` are the uncached ones
        cached = _count(usage.get("cache_read_input_tokens"))
        created = _count(usage.get("cache_creation_input_tokens")) or 0
        prompt = min(prompt + (cached or 0) + created, MAX_USAGE_TOKENS)
    return Usage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=_count(usage.get(f"{names[1]}_tokens")) or 0,
    )


_EVENT_END = re.compile(rb"\r?\n\r?\n")
_EVENT_END_OVERLAP = len(b"\r\n\r\n") - 1  # bytes of an event end that may precede a chunk


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

    __slots__ = (
        "_held",
        "_held_bytes",
        "_held_tail",
        "max_event_bytes",
        "strip_usage_chunk",
        "usage",
    )

    def __init__(
        self, *, strip_usage_chunk: bool, max_event_bytes: int = MAX_READ_ALL_BYTES
    ) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.max_event_bytes = max_event_bytes
        self.usage: Usage | None = None
        self._held: list[bytes] = []  # the unfinished event, as it arrived
        self._held_bytes = 0
        self._held_tail = b""  # its last bytes, where an event end may begin

    def feed(self, chunk: bytes) -> bytes:
        """The events that `chunk` completes; UpstreamError past `max_event_bytes` unfinished."""
        overlap = self._held_tail
        window = overlap + chunk if overlap else chunk  # no copy: a chunk of whole events
        # Events end with a blank line: "\n\n" (vLLM) or "\r\n\r\n" (other servers). The bytes
        # held contain no complete end, so any end found finishes inside `chunk`.
        lf, crlf = window.rfind(b"\n\n"), window.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0) - len(overlap)
        if end <= 0:
            self._hold(chunk)
            return b""
        complete = b"".join((*self._held, chunk[:end])) if self._held else chunk[:end]
        self._held, self._held_bytes, self._held_tail = [], 0, b""
        if end < len(chunk):
            self._hold(chunk[end:])
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
        rest = b"".join(self._held)
        self._held, self._held_bytes, self._held_tail = [], 0, b""
        return rest

    def _hold(self, part: bytes) -> None:
        self._held_bytes += len(part)
        if self._held_bytes > self.max_event_bytes:
            raise UpstreamError("stream", f"an event over {self.max_event_bytes} bytes")
        self._held.append(part)
        self._held_tail = (self._held_tail + part[-_EVENT_END_OVERLAP:])[-_EVENT_END_OVERLAP:]

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
