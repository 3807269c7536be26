"""HTTP/1.1 to the pods: a lean keep-alive client, and an httpx-backed one for tests.

The proxy needs little from HTTP: POST a JSON body, read the status and headers, stream the body
back chunk by chunk, reuse connections. httpx does this at ~1.6 ms of CPU per request on our
machines; `RawUpstream` does it at under 0.1 ms (asyncio streams + the httptools parser that
uvicorn already uses), which is what lets one router process pass 1,000 small requests/s.

`RawUpstream` keeps, per `host:port`, a stack of idle keep-alive connections. A request takes
one (or connects, bounded by `connect_timeout`), writes the request, and parses the response as
bytes arrive; the body is yielded as it is decoded (chunked or content-length). A connection goes
back to the pool only when its response was read to the end and neither side asked to close;
anything else (an error, a cancellation because the client left) closes it, which is how the
pod learns that the request was abandoned. A reused connection that the pod had already closed
(EOF before any response byte) is retried once on a fresh connection: the pod never saw it.

`RawUpstream` opens connections through an injectable `open_connection(host, port)` (default
`asyncio.open_connection`), the seam its unit tests use to script a pod's bytes. `HttpxUpstream`
adapts an `httpx.AsyncClient` to the same interface, so router unit tests can use
`httpx.MockTransport`. Both raise `UpstreamError(kind)` with kind `connect`, `timeout` or `stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import httpx


class UpstreamError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class UpstreamResponse(Protocol):
    status: int
    headers: list[tuple[bytes, bytes]]  # lower-case names

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises UpstreamError if the pod fails mid-body."""
        ...

    async def aclose(self) -> None:
        """Release the connection (back to the pool if the body was read to the end)."""
        ...


class Upstream(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        *,
        connect_timeout: float,
        head_timeout: float,
    ) -> UpstreamResponse:
        """Send; return once the status line and headers arrived (within `head_timeout`)."""
        ...

    def know(self, url: str) -> None:
        """`url`'s host is a pod now: its connections are kept for the next request."""
        ...

    def forget(self, url: str) -> None:
        """Close idle connections to `url`'s host and keep none after (the pod left)."""
        ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------


class StreamWriter(Protocol):
    """What the client needs of a connection's writing side (`asyncio.StreamWriter`)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...


OpenConnection = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, StreamWriter]]]


class _StaleConnection(Exception):
    """A reused connection was closed by the pod before it answered (it never saw the request)."""


class _Connection:
    __slots__ = ("key", "reader", "writer")

    def __init__(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: StreamWriter
    ) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


# A pod's status line and headers are at most this big (the router's own limit for a client's
# head, `server.max_header_bytes`): the parser keeps every header, and the proxy forwards them.
MAX_RESPONSE_HEAD_BYTES = 64 << 10


class _Parser:
    """httptools callbacks collecting one response."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: list[bytes] = []
        self.complete = False
        self.unsolicited = False  # bytes after the response: the connection cannot be reused

    def on_message_begin(self) -> None:
        if self.complete:
            self.unsolicited = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if not self.unsolicited:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _RawResponse:
    def __init__(
        self,
        pool: RawUpstream,
        conn: _Connection,
        parser: httptools.HttpResponseParser,
        state: _Parser,
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._parser = parser
        self._state = state
        self.status: int = parser.get_status_code()
        self.headers = state.headers
        # llhttp forgets keep-alive once the message completes: decide from the head.
        self._keep_alive = parser.get_http_version() == "1.1" and not any(
            name == b"connection" and value.lower() == b"close" for name, value in state.headers
        )

    async def chunks(self) -> AsyncIterator[bytes]:
        state = self._state
        while True:
            if state.body:
                pending, state.body = state.body, []
                for piece in pending:
                    yield piece
            if state.complete:
                return
            conn = self._conn
            if conn is None:
                raise UpstreamError("stream", "response already closed")
            try:
                data = await conn.reader.read(65536)
            except OSError as exc:
                raise UpstreamError("stream", repr(exc)) from exc
            if not data:
                # EOF: fine for a body delimited by the connection's end, else a broken stream.
                with contextlib.suppress(httptools.HttpParserError):
                    self._parser.feed_data(b"")
                if state.complete or self._delimited_by_close():
                    state.complete = True
                    self._keep_alive = False
                    continue
                raise UpstreamError("stream", "connection closed mid-body")
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise UpstreamError("stream", f"bad response: {exc}") from exc

    def _delimited_by_close(self) -> bool:
        names = {name for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        state = self._state
        if state.complete and not state.unsolicited and self._keep_alive and conn.usable():
            self._pool._release(conn)
        else:
            conn.close()


def _host_key(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "", parts.port or 80)


class RawUpstream:
    """Keep-alive HTTP/1.1 connections per `host:port` (plain TCP; https goes through httpx)."""

    def __init__(
        self,
        max_idle_per_host: int = 512,
        open_connection: OpenConnection = asyncio.open_connection,
    ) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host
        self._open = open_connection

    def _release(self, conn: _Connection) -> None:
        """Keep `conn` for the next request to its host, unless that host is not a pod now (it
        left while the answer was read, or before a request planned earlier was sent: kept,
        the connection sat in CLOSE_WAIT until the address came back)."""
        idle = self._idle.get(conn.key)
        if idle is not None and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int], limit_seconds: float) -> _Connection:
        try:
            async with asyncio.timeout(limit_seconds):
                reader, writer = await self._open(key[0], key[1])
        except TimeoutError as exc:
            raise UpstreamError("connect", f"connect to {key[0]}:{key[1]} timed out") from exc
        except OSError as exc:
            raise UpstreamError("connect", f"connect to {key[0]}:{key[1]}: {exc}") from exc
        return _Connection(key, reader, writer)

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)  # None: not a pod now (`know`, `forget`)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        *,
        connect_timeout: float,
        head_timeout: float,
    ) -> UpstreamResponse:
        parts = urlsplit(url)
        host = parts.hostname or ""
        key = (host, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode()]
        head.extend(name + b": " + value + b"\r\n" for name, value in headers)
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        payload = b"".join(head) + body
        conn = self._take_idle(key)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(key, connect_timeout)
            try:
                return await self._exchange(conn, payload, head_timeout)
            except _StaleConnection:
                conn.close()
                if not reused:
                    raise UpstreamError("stream", "connection closed before a response") from None
                conn, reused = None, False  # the pod closed an idle connection: try a fresh one
            except BaseException:
                conn.close()
                raise

    async def _exchange(
        self, conn: _Connection, payload: bytes, limit_seconds: float
    ) -> _RawResponse:
        state = _Parser()
        parser = httptools.HttpResponseParser(state)
        conn.writer.write(payload)
        received = 0
        try:
            async with asyncio.timeout(limit_seconds):
                while not state.headers_done:
                    data = await conn.reader.read(65536)
                    if not data:
                        if not received:
                            raise _StaleConnection
                        raise UpstreamError("stream", "connection closed in the response head")
                    received += len(data)
                    parser.feed_data(data)
                    if not state.headers_done and received > MAX_RESPONSE_HEAD_BYTES:
                        raise UpstreamError(
                            "stream", f"response head over {MAX_RESPONSE_HEAD_BYTES} bytes"
                        )
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"no response within {limit_seconds} s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            if not received:
                raise _StaleConnection from exc
            raise UpstreamError("stream", repr(exc)) from exc
        except OSError as exc:
            raise UpstreamError("stream", repr(exc)) from exc
        except httptools.HttpParserError as exc:
            raise UpstreamError("stream", f"bad response: {exc}") from exc
        return _RawResponse(self, conn, parser, state)

    def know(self, url: str) -> None:
        self._idle.setdefault(_host_key(url), [])

    def forget(self, url: str) -> None:
        for conn in self._idle.pop(_host_key(url), []):
            conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


# ---------------------------------------------------------------------------------------------


class _HttpxResponse:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = [(k.lower(), v) for k, v in response.headers.raw]

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TimeoutException as exc:
            raise UpstreamError("timeout", repr(exc)) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("stream", repr(exc)) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    """The same interface over an `httpx.AsyncClient` (tests: `httpx.MockTransport`; https)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        *,
        connect_timeout: float,
        head_timeout: float,
    ) -> UpstreamResponse:
        timeout = httpx.Timeout(
            connect=connect_timeout, read=head_timeout, write=connect_timeout, pool=connect_timeout
        )
        request = self.client.build_request(
            method, url, content=body, headers=headers, timeout=timeout
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            # Only a read timeout waited for a head: the others never reached the pod (or never
            # finished sending), as a connect failure (a whole answer's head timeout is final).
            kind = "timeout" if isinstance(exc, httpx.ReadTimeout) else "connect"
            raise UpstreamError(kind, repr(exc)) from exc
        except (httpx.TransportError, OSError) as exc:
            raise UpstreamError("connect", repr(exc)) from exc
        return _HttpxResponse(response)

    def know(self, url: str) -> None:
        return None  # httpx pools every host itself

    def forget(self, url: str) -> None:
        return None  # httpx expires idle connections itself

    async def aclose(self) -> None:
        await self.client.aclose()


class RoutingUpstream:
    """Plain-HTTP URLs through `RawUpstream`, anything else (https) through httpx."""

    def __init__(self, raw: RawUpstream, fallback: HttpxUpstream) -> None:
        self._raw = raw
        self._fallback = fallback

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        *,
        connect_timeout: float,
        head_timeout: float,
    ) -> UpstreamResponse:
        target: Upstream = self._raw if url.startswith("http://") else self._fallback
        return await target.request(
            method, url, body, headers, connect_timeout=connect_timeout, head_timeout=head_timeout
        )

    def know(self, url: str) -> None:
        self._raw.know(url)

    def forget(self, url: str) -> None:
        self._raw.forget(url)

    async def aclose(self) -> None:
        await self._raw.aclose()
        await self._fallback.aclose()


# A body the router reads whole (a pod's /metrics, a warm request's answer), or one event of a
# stream it holds until the event ends (`usage.SseUsageTap`), is at most this big: a pod that
# sends more fails that read, and the router's memory stays bounded whatever the pod does.
MAX_READ_ALL_BYTES = 16 << 20


_TIMER_SLACK_SECONDS = 0.001  # a timer that fires this early counts as on time (uvloop's ms)


async def paced(
    chunks: AsyncIterator[bytes], gap_seconds: float, *, until: float | None = None
) -> AsyncGenerator[bytes, None]:
    """`chunks`, failing with UpstreamError("timeout") once the pod sends nothing for
    `gap_seconds`, or at `until` (the event loop's clock) if given: a pod that stalls mid-body,
    or drips it, must not hold the request (and its client) forever. Only the time spent waiting
    for the pod counts; the time the caller takes with a chunk (sending it on) does not.

    One timer per body, looked at when it fires, not an `asyncio.timeout` per chunk: a long
    answer streamed token by token paid one for every event (enter, a timer set and cancelled,
    exit), 13% of the router's time while it relayed ~5,000 events a second. The timer cancels
    the task only while it waits inside `anext` (as `asyncio.timeout` does), and the
    cancellation becomes the UpstreamError here unless someone else cancelled the task too."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    waiting_since = -1.0  # when the wait for the next chunk began; < 0: not waiting
    expired = ""  # why the timer cancelled the wait
    # (uvloop rounds timers to the millisecond, may fire one early, and hands back a plain
    # Handle, without `when()`, for one due within half a millisecond: the time is kept here)
    timer_at = loop.time() + gap_seconds
    timer: asyncio.Handle

    def arm(at: float) -> None:
        nonlocal timer, timer_at
        timer_at = at
        timer = loop.call_at(at, check)

    def check() -> None:
        nonlocal expired
        if task.done():
            return
        now = loop.time()
        if waiting_since < 0:  # the caller has the chunk: look again a gap from now
            arm(now + gap_seconds)
            return
        end = waiting_since + gap_seconds
        if until is not None and until < end:
            end = until
        if now < end - _TIMER_SLACK_SECONDS:
            arm(end)
            return
        expired = (
            "the answer did not end in time"
            if end == until
            else (f"nothing from the pod for {gap_seconds} s")
        )
        task.cancel()

    def timed_out() -> UpstreamError:
        """The timer's cancellation, taken back (however the source ended), as the error."""
        task.uncancel()
        return UpstreamError("timeout", expired)

    arm(timer_at)
    try:
        while True:
            now = loop.time()
            if until is not None:
                if now >= until:
                    raise UpstreamError("timeout", "the answer did not end in time")
                if timer_at > until:
                    timer.cancel()
                    arm(until)
            cancelling = task.cancelling()
            waiting_since = now
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                if expired:  # the source swallowed the cancellation
                    raise timed_out() from None
                return
            except asyncio.CancelledError:
                if not expired or task.uncancel() > cancelling:
                    raise
                raise UpstreamError("timeout", expired) from None
            except BaseException:
                if expired:  # the source turned the cancellation into its own error
                    task.uncancel()
                raise
            finally:
                waiting_since = -1.0
            if expired:  # the source swallowed the cancellation and went on
                raise timed_out()
            yield chunk
    finally:
        timer.cancel()


async def read_all(response: UpstreamResponse, max_bytes: int = MAX_READ_ALL_BYTES) -> bytes:
    """The whole body, then release the connection; UpstreamError("too_large") past
    `max_bytes`."""
    try:
        return await join_chunks(response.chunks(), max_bytes)
    finally:
        await response.aclose()


async def join_chunks(chunks: AsyncIterator[bytes], max_bytes: int, first: bytes = b"") -> bytes:
    """`first` (a chunk already read) and the rest of `chunks`, joined; UpstreamError("too_large")
    once they pass `max_bytes`, before more is kept."""
    parts = [first]
    size = len(first)
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise UpstreamError("too_large", f"body over {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)
