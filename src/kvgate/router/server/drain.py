"""End the requests still open when the shutdown grace runs out, each in a way its client
understands, instead of a cut connection.

`Drain.run` wraps every HTTP request: it remembers the task serving it and watches what the
app sends (has the response started? is it an event stream? is it complete?). The server calls
`Drain.expire()` when the grace is over (`kvgate.serving.serve(on_grace_expired=...)`); every
request still running is cancelled (which closes its pod connection, so the engine aborts the
work) and then finished here:

- a stream that started (SSE): an OpenAI error event, `data: {"error": {..., "type":
  "service_unavailable", "code": "shutting_down"}}`, then the end of the body (no `[DONE]`); on
  the Responses and Messages APIs their own `error` event;
- no response started yet (also a request still queued): a 503 in the OpenAI error shape
  (Anthropic's on `/v1/messages`; `connection: close`, `retry-after: 1`);
- another response half sent (rare: non-streaming answers go out in one piece): nothing can
  be added; the connection closes.

A cancellation that is not the drain's (a client disconnect) passes through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from kvgate.router.core.errors import anthropic_error_body, error_bytes
from kvgate.router.http.proxy import stream_error

log = logging.getLogger(__name__)


def _api(path: str) -> str:
    """Whose error shapes a request's client reads: Anthropic's, the Responses API's, or chat
    and completions'."""
    if path.startswith("/v1/messages"):
        return "messages"
    return "responses" if path.startswith("/v1/responses") else "chat"


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

_MESSAGE = "the router is shutting down; retry the request"
# Writing the last words must not hold the shutdown up (a client that does not read).
_FINAL_WRITE_SECONDS = 1.0


class _Response:
    __slots__ = ("complete", "event_stream", "started")

    def __init__(self) -> None:
        self.started = False
        self.event_stream = False
        self.complete = False

    def observe(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type":
                    self.event_stream = value.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True


class Drain:
    """In-flight HTTP requests of one app. `on_cut(kind)` counts each request ended by
    `expire()`: `stream` (error event), `unavailable` (503) or `closed`; `on_start(path,
    status)` sees every response the app starts (the one place each passes through)."""

    def __init__(
        self,
        on_cut: Callable[[str], None] | None = None,
        on_start: Callable[[str, int], None] | None = None,
    ) -> None:
        self._on_cut = on_cut or (lambda kind: None)
        self._on_start = on_start or (lambda path, status: None)
        self._requests: dict[asyncio.Task[Any], _Response] = {}
        self.expired = False

    def __len__(self) -> int:
        return len(self._requests)

    async def run(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        response = _Response()

        async def tracked_send(message: Message) -> None:
            response.observe(message)
            if message["type"] == "http.response.start":
                self._on_start(scope["path"], message["status"])
            await send(message)

        self._requests[task] = response
        try:
            await handler(scope, receive, tracked_send)
        except asyncio.CancelledError:
            if not self.expired:
                raise
            task.uncancel()
            await self._finish(response, send, _api(scope.get("path", "")))
        finally:
            self._requests.pop(task, None)

    def expire(self) -> None:
        """The grace is over: cancel every request still running (each is then finished)."""
        self.expired = True
        running = [t for t, r in self._requests.items() if not r.complete and not t.done()]
        if running:
            log.warning("shutdown grace over: ending %d request(s) still in flight", len(running))
        for task in running:
            task.cancel()

    async def _finish(self, response: _Response, send: Send, api: str) -> None:
        if response.complete:
            return
        if not response.started:
            kind = "unavailable"
            payload = error_bytes(_MESSAGE, "service_unavailable", "shutting_down")
            if api == "messages":
                payload = json.dumps(anthropic_error_body(503, _MESSAGE)).encode()
            messages: list[Message] = [
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                        (b"connection", b"close"),
                        (b"retry-after", b"1"),
                    ],
                },
                {"type": "http.response.body", "body": payload},
            ]
        elif response.event_stream:
            kind = "stream"
            if api == "chat":
                body = error_bytes(_MESSAGE, "service_unavailable", "shutting_down")
                event = b"data: " + body + b"\n\n"
            else:
                event = stream_error(api, _MESSAGE, "shutting_down", 503)
            messages = [{"type": "http.response.body", "body": event}]
        else:
            self._on_cut("closed")
            return
        self._on_cut(kind)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_FINAL_WRITE_SECONDS):
                for message in messages:
                    await send(message)
