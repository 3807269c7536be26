"""Bounds on every client connection: header bytes, header/body/idle time, connection count.

uvicorn's httptools protocol bounds none of these (a 64 MB header is buffered, a connection
sending one header byte a second is held forever, an idle connection costs a file descriptor
until the client leaves). `EdgeProtocol` subclasses it and adds, per connection, one deadline
for the phase the connection is in:

| phase | ends at | deadline | over the limit |
|---|---|---|---|
| idle (new, or kept alive after a response) | a request's first byte | `idle_timeout` | closed silently |
| head (request line + headers) | the end of the headers | `header_timeout` | 408 |
| body | the end of the body | `body_timeout` | 408 (or closed, if a response started) |
| busy (the app answers) | the end of the response | none (the app's own timeouts) | — |

Across every phase, a client whose answer waits to go out (the transport's send buffer over its
high-water mark, while uvicorn holds the app's `send`) and that reads less than
`MIN_WRITE_PROGRESS_BYTES` of it in `write_stall_timeout` is cut off: the connection is
aborted, since what is buffered for it would never go out, and the app sees a disconnect (a
slow reader would otherwise hold its request, and the pod's, as long as it pleased). A client
that reads on, however large its answer, is looked at again a timeout later.

Header bytes are counted as they arrive, before the parser buffers them; a completed head is
measured exactly (URL + header names and values). Over `max_header_bytes`: 431.

Connections are admitted up to `max_connections`. At the cap, the oldest idle keep-alive
connection is closed to make room (an idle connection is the cheapest thing to give up: its
client reconnects); with none idle, the new connection is answered 503 as soon as its head
arrives (or closed after a short wait), and beyond a few such pending refusals it is aborted at
once, so file descriptors stay bounded whatever clients do.

Refusals are answered with an OpenAI-shaped JSON error and `connection: close`; the write side
is then shut and the connection lingers for up to a second (discarding input) so the client can
read the answer before the socket closes (closing with unread input would send a reset that can
destroy the answer in flight). No refusal reaches the ASGI app, so none can raise there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# A refused connection stays open at most this long so that its client reads the answer.
_LINGER_SECONDS = 1.0
# Connections over the cap wait at most this long for their head before being closed.
_OVER_CAPACITY_WAIT_SECONDS = 2.0
# Connections over the cap that may wait for their 503 at once; more are aborted on arrival.
MAX_PENDING_REFUSALS = 32
# A client whose answer is held back must read at least this much of it per write-stall timeout.
MIN_WRITE_PROGRESS_BYTES = 16 * 1024
# ioctl for the bytes in a socket's send queue (Linux); elsewhere only the transport's are seen.
_SIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None) if sys.platform == "linux" else None
# Method, spaces, "HTTP/1.1", CRLFs of the request line and of the blank line.
_REQUEST_LINE_OVERHEAD = 16

_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class EdgeLimits:
    """Per-connection limits (the router's `server` config; docs/configuration.md)."""

    max_header_bytes: int = 64 * 1024
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    idle_timeout_seconds: float = 15.0
    write_stall_timeout_seconds: float = 60.0
    max_connections: int = 2048


class EdgeState:
    """What the connections of one server share: the admitted set (oldest first) and counters.

    `on_close(reason)` is called for each connection the edge ends for a reason worth counting:
    `header_too_large`, `header_timeout`, `body_timeout`, `over_capacity`, `evicted_idle`,
    `write_stall`."""

    def __init__(self, limits: EdgeLimits, on_close: Callable[[str], None] | None = None) -> None:
        self.limits = limits
        self.on_close = on_close or (lambda reason: None)
        self.admitted: dict[EdgeProtocol, None] = {}  # insertion order = age
        self.pending_refusals = 0

    @property
    def open_connections(self) -> int:
        return len(self.admitted) + self.pending_refusals

    def admit(self, connection: EdgeProtocol) -> bool:
        """Admit `connection`, evicting the oldest idle one at the cap; False if full."""
        if len(self.admitted) >= self.limits.max_connections:
            idle = next((c for c in self.admitted if c.is_idle()), None)
            if idle is None:
                return False
            idle.evict()
        self.admitted[connection] = None
        return True


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above. Bind it to a server's shared state
    with `protocol_class(state)`; uvicorn instantiates it once per connection."""

    edge: EdgeState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._write_stall: asyncio.TimerHandle | None = None
        self._unsent_at_stall = 0  # bytes buffered for the client when the stall timer was set
        self._reading_head = False
        self._reading_body = False
        self._head_bytes = 0
        self._over_capacity = False
        self._refused = False
        self._pending_refusal = False

    # -- connection lifecycle

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        edge = self.edge
        if edge.admit(self):
            self._arm(edge.limits.idle_timeout_seconds, self._idle_expired)
            return
        edge.on_close("over_capacity")
        if edge.pending_refusals >= MAX_PENDING_REFUSALS:
            transport.abort()
            return
        self._over_capacity = self._pending_refusal = True
        edge.pending_refusals += 1
        wait = min(edge.limits.header_timeout_seconds, _OVER_CAPACITY_WAIT_SECONDS)
        self._arm(wait, self._close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_write_stall()
        self.edge.admitted.pop(self, None)
        if self._pending_refusal:
            self._pending_refusal = False
            self.edge.pending_refusals -= 1
        super().connection_lost(exc)

    def is_idle(self) -> bool:
        """Between requests: nothing of a request received, no response being written."""
        return (
            not self._reading_head
            and not self._reading_body
            and not self._refused
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.transport.is_closing()
        )

    def evict(self) -> None:
        self.edge.admitted.pop(self, None)
        self.edge.on_close("evicted_idle")
        self._close()

    # -- input

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after a refusal: discard
        if not self._reading_head and not self._reading_body:
            self._start_head()
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._reading_head and self._head_bytes > self.edge.limits.max_header_bytes:
            self._refuse(431, "header_too_large", "request headers are too large")

    def send_400_response(self, msg: str) -> None:
        # A request pipelined behind a refused one can fail to parse in the same `feed_data`:
        # the refusal already answered, and the write side is shut.
        if not self._refused:
            super().send_400_response(msg)

    # Parser callbacks (called from inside `feed_data`). Once a connection is refused, the rest
    # of what its client sent must not reach uvicorn's request machinery.

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        if not self._reading_head:
            self._start_head()

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._reading_head = False
        size = len(self.url) + _REQUEST_LINE_OVERHEAD
        size += sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.edge.limits.max_header_bytes:
            self._refuse(431, "header_too_large", "request headers are too large")
            return
        if self._over_capacity:
            self._refuse(503, "", "the router is at its connection limit; retry", retry=True)
            return
        self._reading_body = True
        self._arm(self.edge.limits.body_timeout_seconds, self._body_expired)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._reading_body = False
        super().on_message_complete()
        self._arm_idle_or_disarm()  # busy: the app's own timeouts bound its answer

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer; ours replaces it. A body still arriving after an
        # early answer (a 413, say) keeps its body deadline.
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
            if not self._reading_body:
                self._arm_idle_or_disarm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_stall is None:
            self._arm_write_stall()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write_stall()

    # -- deadlines

    def _disarm_write_stall(self) -> None:
        if self._write_stall is not None:
            self._write_stall.cancel()
            self._write_stall = None

    def _unsent(self) -> int:
        """Bytes written for the client that it has not taken yet: the transport's buffer and,
        where the OS tells (Linux's SIOCOUTQ), the socket's send queue, which can hold megabytes
        and drains first."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None and _SIOCOUTQ is not None:
            with contextlib.suppress(OSError, ValueError):
                queued = fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0")
                unsent += int.from_bytes(queued, sys.byteorder, signed=True)
        return unsent

    def _arm_write_stall(self) -> None:
        self._unsent_at_stall = self._unsent()
        seconds = self.edge.limits.write_stall_timeout_seconds
        self._write_stall = self.loop.call_later(seconds, self._write_stalled)

    def _write_stalled(self) -> None:
        self._write_stall = None
        if self._unsent() <= self._unsent_at_stall - MIN_WRITE_PROGRESS_BYTES:  # it reads, slowly
            self._arm_write_stall()
            return
        self.edge.on_close("write_stall")
        log.debug("closing connection from %s: it does not read its answer", self.client)
        self.transport.abort()  # close() would wait for a buffer that never drains

    def _start_head(self) -> None:
        self._reading_head = True
        self._head_bytes = 0
        if not self._over_capacity:
            self._arm(self.edge.limits.header_timeout_seconds, self._head_expired)

    def _arm_idle_or_disarm(self) -> None:
        if self.is_idle():
            self._arm(self.edge.limits.idle_timeout_seconds, self._idle_expired)
        else:
            self._disarm()

    def _idle_expired(self) -> None:
        self._deadline = None
        if self.is_idle():
            self._close()

    def _head_expired(self) -> None:
        self._deadline = None
        if self._reading_head and not self._refused:
            self._refuse(408, "header_timeout", "request headers not received in time")

    def _body_expired(self) -> None:
        self._deadline = None
        if not self._reading_body or self._refused:
            return
        cycle = self.cycle
        if self.pipeline or (cycle is not None and cycle.response_started):
            # A response is on the wire (this request's, or the one ahead of a pipelined
            # request): no room for a 408 in it.
            self.edge.on_close("body_timeout")
            self._close()
            return
        if cycle is not None:  # the app sees a disconnect; nothing it sends goes out
            cycle.disconnected = True
            cycle.message_event.set()
        self._refuse(408, "body_timeout", "request body not received in time")

    def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    # -- answers

    def _refuse(self, status: int, reason: str, message: str, *, retry: bool = False) -> None:
        if reason:
            self.edge.on_close(reason)
        log.debug("refusing connection from %s: %d %s", self.client, status, message)
        error_type = "invalid_request_error" if status < 500 else "service_unavailable"
        error = {"message": message, "type": error_type, "code": reason or "too_many_connections"}
        body = json.dumps({"error": {**error, "param": None}}).encode()
        head = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if retry:
            head.append("retry-after: 1")
        self._refused = True
        self._reading_head = self._reading_body = False
        transport = self.transport
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        if transport.can_write_eof():
            transport.write_eof()
        self._arm(_LINGER_SECONDS, self._close)

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(state: EdgeState) -> type[EdgeProtocol]:
    """An `EdgeProtocol` subclass bound to `state`, to pass to uvicorn as `http=`."""

    class BoundEdgeProtocol(EdgeProtocol):
        edge = state

    return BoundEdgeProtocol
