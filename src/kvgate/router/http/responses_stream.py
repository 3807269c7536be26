"""What the router needs to know of a Responses API event stream (`POST /v1/responses`).

vLLM opens such a stream with `response.created` and `response.in_progress` (the request echoed,
no output) at once, before the prompt's prefill; the first output event (an output item, a text
or reasoning delta, an error, `response.failed`) comes with the first token. So the first byte is
not the first token here: the proxy holds the opening events back (`OpeningEvents`) until an
output event arrives, which keeps TTFT, the prefill-rate estimate and the pending-prefill
accounting as true as for a chat stream, and keeps a failure before the first token retryable
(the client has seen nothing). The events are Server-Sent Events with an `event:` line (vLLM
writes one); without it, the type is read from the data.
"""

from __future__ import annotations

import json
import re

from kvgate.router.http.upstream import UpstreamError

_OPENING_DATA = re.compile(rb'"type"\s*:\s*"response\.(?:created|in_progress|queued)"')
_OPENING_TYPES = {b"response.created", b"response.in_progress", b"response.queued"}
_EVENT_END = re.compile(rb"\r?\n\r?\n")


def is_opening(event: bytes) -> bool:
    """Whether one complete event is an opening one (no output yet)."""
    for line in event.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip() in _OPENING_TYPES
    # No event line: the type is the event object's own (an output event's text is a JSON
    # string, where a quote is escaped, so it cannot hold this pattern).
    return _OPENING_DATA.search(event) is not None


class OpeningEvents:
    """Feed the stream's first bytes; `feed` is True once they hold a complete event that is
    not an opening one. What was fed is `held`, bounded by `max_bytes` (UpstreamError past it).
    Linear in the bytes fed, however the pod cuts them."""

    __slots__ = ("_held", "_searched", "_start", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held = bytearray()
        self._start = 0  # where the next unfinished event begins
        self._searched = 0  # no event end lies wholly before this

    @property
    def held(self) -> bytes:
        return bytes(self._held)

    def feed(self, chunk: bytes) -> bool:
        held = self._held
        if len(held) + len(chunk) > self.max_bytes:
            raise UpstreamError("stream", f"opening events over {self.max_bytes} bytes")
        held += chunk
        while True:
            # An end may have begun in the last 3 bytes searched before.
            match = _EVENT_END.search(held, max(self._start, self._searched - 3))
            if match is None:
                self._searched = len(held)
                return False
            event = bytes(held[self._start : match.end()])
            self._start = self._searched = match.end()
            if not is_opening(event):
                return True


def error_event(message: str, code: str) -> bytes:
    """The Responses API's stream error event (the stream broke after its first output)."""
    payload = {"type": "error", "code": code, "message": message, "param": None}
    return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
