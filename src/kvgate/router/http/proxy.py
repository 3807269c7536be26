"""Send a planned request to its pod and stream the answer back; retry before the first byte.

The proxy is I/O only: every decision and every piece of endpoint state is the routing core's
(`kvgate.router.core.lifecycle`), told through its hooks. One attempt:
1. `core.sent`: the request is counted on the pod.
2. POST the body; wait for the response head and its first body chunk (bounded by
   `first_byte_timeout`). Nothing has reached the client yet, so a connection failure, a timeout
   or a 5xx from the pod is retried on another pod: `core.failed`, then `core.plan` again (the
   core excludes the pods already tried), up to `max_retries` times.
3. At the first body byte (of a Responses API stream: its first output event, the opening
   events held back until then, `responses_stream.py`): `core.first_byte`. An event stream's
   head goes to the client at once with the `x-kvgate-*` headers; a whole answer (JSON, any
   error status) is first read to its end (each gap bounded by `read_timeout`, at most
   `max_response_bytes`): a failure while reading it has sent the client nothing, so it is
   retried as in 2; an answer over `max_response_bytes` is not (another pod would write it
   again): a 502.
4. A stream passes through as it arrives (each gap bounded by `read_timeout`; from the first
   byte to the last, an answer of either kind by `max_answer_seconds`). Usage is read on
   the way (`usage.py`). A pod failing after the first byte cannot be retried without
   duplicating output: a stream ends with an error event in its API's shape instead of its
   normal end (`stream_error`), and `core.broke` counts it against the pod as a failure before
   the first byte is. Then `core.finished` learns from the outcome.

`relay` sends a request only one pod can answer and nothing is learned from (a stored
response's retrieval or cancel, a token count) to that pod, bounded as above, never retried.

Cancellation (the client went away) propagates into the upstream request, which closes the
connection to the pod, and vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from kvgate.api.router_config import LimitsConfig
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.accounting import Attempt
from kvgate.router.core.errors import RouterError, anthropic_error_body, error_bytes
from kvgate.router.core.learn import Outcome, Usage
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.routing import RoutePlan
from kvgate.router.http.responses_stream import OpeningEvents, error_event
from kvgate.router.http.upstream import (
    Upstream,
    UpstreamError,
    UpstreamResponse,
    join_chunks,
    paced,
)
from kvgate.router.http.usage import SseUsageTap, usage_from_json_body

log = logging.getLogger(__name__)

Send = Callable[[dict[str, object]], Awaitable[None]]

_DROP_RESPONSE_HEADERS = {
    b"content-length",
    b"transfer-encoding",
    b"connection",
    b"keep-alive",
    b"date",
    b"server",
    b"x-request-id",  # vLLM echoes it (--enable-request-id-headers); the router sets its own
}


class _Retryable(Exception):
    """The attempt failed before the client got a byte: another pod may be tried (unless
    `retry` is False: the request itself is the cause)."""

    def __init__(
        self,
        kind: str,
        detail: str,
        status: int = 502,
        *,
        retry: bool = True,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status = status
        self.retry = retry
        self.retry_after = retry_after  # a 503's `retry-after`, seconds


#: A pod's `retry-after` is passed on up to this many seconds (delta-seconds only).
MAX_RETRY_AFTER_SECONDS = 3600


def _retry_after(headers: list[tuple[bytes, bytes]]) -> float | None:
    value = _header(headers, b"retry-after").strip()
    if not value.isdigit() or len(value) > 6:
        return None  # absent, an HTTP date or garbage
    return float(min(int(value), MAX_RETRY_AFTER_SECONDS))


ADAPTER_MISSING = "adapter_missing"  # a pod's 404 for a LoRA adapter of its pool


#: An error body is read this far, to reuse its connection; past it the connection is closed.
MAX_ERROR_BODY_BYTES = 64 << 10


async def _discard_error_body(response: UpstreamResponse, read_timeout: float) -> None:
    """Read a failed answer's body and drop it, so that its connection can be reused: at most
    `MAX_ERROR_BODY_BYTES` (a longer one is not worth its bytes; closing the connection is
    cheaper), for one read timeout in all (a body that drips must not keep the client from its
    answer, or from another pod). Nothing is kept: joining it held up to 16 MiB a request."""
    until = asyncio.get_running_loop().time() + read_timeout
    read = 0
    chunks = paced(response.chunks(), read_timeout, until=until)
    with contextlib.suppress(UpstreamError):
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                read += len(chunk)
                if read > MAX_ERROR_BODY_BYTES:
                    return  # left unread: `aclose` closes the connection


def _adapter_missing(plan: RoutePlan, body: bytes) -> bool:
    """A pod's 404 saying a LoRA adapter of its pool does not exist there: vLLM's answer for an
    adapter it has not loaded (a rollout adding it to the pool, adapters loaded at run time),
    which another pod may have. Any other 404 (a Responses follow-up the pod no longer holds,
    say) is the pod's answer."""
    model = plan.classification.model
    return plan.pool.lora_for(model) is not None and f"`{model}` does not exist".encode() in body


@dataclass
class _Answer:
    status: int
    usage: Usage | None
    completed: bool
    streamed: bool


class Proxy:
    def __init__(self, upstream: Upstream, core: RoutingCore, limits: LimitsConfig) -> None:
        self.upstream = upstream
        self.core = core
        self.limits = limits

    async def forward(
        self,
        request: ClientRequest,
        plan: RoutePlan,
        path: str,
        body: Callable[[RoutePlan], bytes],
        *,
        stream: bool,
        strip_usage: bool,
        send: Send,
    ) -> Outcome:
        """Send `plan`, retrying on other endpoints before the first byte; the core learns.
        `body(plan)`: what to send to the plan's pool."""
        core = self.core
        while True:
            attempt = core.sent(request, plan, streaming=stream)
            try:
                answer = await self._attempt(
                    request, plan, path, body(plan), stream, strip_usage, send, attempt
                )
            except _Retryable as failure:
                if failure.kind == ADAPTER_MISSING:
                    core.unserved(plan, attempt, failure.kind)
                else:
                    core.failed(plan, attempt, failure.kind)
                log.warning(
                    "request %s: %s failed before the first byte (%s: %s)",
                    request.request_id,
                    plan.endpoint.id,
                    failure.kind,
                    failure,
                )
                if not failure.retry or len(request.tried) > self.limits.max_retries:
                    raise self._final_error(failure) from None
                try:
                    plan = await core.plan(request)
                except RouterError:
                    raise self._final_error(failure) from None
                continue
            except BaseException:
                core.cancelled(plan, attempt)  # the client left (or a bug): nothing to learn
                raise
            return core.finished(
                request,
                plan,
                attempt,
                status=answer.status,
                usage=answer.usage,
                completed=answer.completed,
                streamed=answer.streamed,
            )

    async def relay(
        self,
        endpoint: Endpoint,
        method: str,
        target: str,
        send: Send,
        body: bytes = b"",
        *,
        request_id: str,
    ) -> None:
        """A request only one pod answers and nothing is learned from (a stored response's
        retrieval or cancel, a token count), sent to `endpoint` (no retry) and answered as it
        comes: an event stream passes through (each gap bounded by `read_timeout`, the whole by
        `max_answer_seconds`), any other answer is read whole first (at most
        `max_response_bytes`). RouterError 502/504 when the pod fails before an answer."""
        limits = self.limits
        headers = [
            (b"accept", b"application/json, text/event-stream"),
            (b"x-request-id", request_id.encode()),
            *self.core.state.pod_headers(endpoint.pool),
        ]
        if body:
            headers.append((b"content-type", b"application/json"))
        try:
            response = await self.upstream.request(
                method,
                endpoint.spec.url + target,
                body,
                headers,
                connect_timeout=limits.connect_timeout_seconds,
                head_timeout=limits.first_byte_timeout_seconds,
            )
        except UpstreamError as exc:
            raise self._final_error(_Retryable(exc.kind, str(exc))) from None
        try:
            until = asyncio.get_running_loop().time() + limits.max_answer_seconds
            chunks = paced(response.chunks(), limits.read_timeout_seconds, until=until)
            headers = _passed_headers(response.headers)
            headers.append((b"x-kvgate-endpoint", endpoint.id.encode()))
            headers.append((b"x-request-id", request_id.encode()))
            if not _header(response.headers, b"content-type").startswith(b"text/event-stream"):
                try:
                    payload = await join_chunks(chunks, limits.max_response_bytes)
                except UpstreamError as exc:
                    raise self._final_error(_Retryable(exc.kind, str(exc))) from None
                headers.append((b"content-length", str(len(payload)).encode()))
                await send(
                    {"type": "http.response.start", "status": response.status, "headers": headers}
                )
                await send({"type": "http.response.body", "body": payload})
                return
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            events = SseUsageTap(strip_usage_chunk=False)  # whole events only
            try:
                async for chunk in chunks:
                    out = events.feed(chunk)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
            except UpstreamError as exc:
                message = f"the model server failed mid-stream ({exc.kind})"
                await _release(response)
                with contextlib.suppress(Exception):
                    await send(
                        {"type": "http.response.body", "body": error_event(message, exc.kind)}
                    )
                return
            await send({"type": "http.response.body", "body": events.flush()})
        finally:
            await response.aclose()

    @staticmethod
    def _final_error(failure: _Retryable) -> RouterError:
        """What the client gets when no attempt succeeded: the last failure's 504 (timeout), 503
        (the pod was overloaded, with its `retry-after` for the SDKs' backoff) or 502."""
        if failure.kind == "timeout":
            return RouterError(504, f"upstream timed out: {failure}", type="upstream_error")
        if failure.kind == ADAPTER_MISSING:
            return RouterError(
                404,
                "no pod tried has loaded the model's adapter; retry later",
                type="NotFoundError",
                code="model_not_loaded",
            )
        if failure.status == 503:
            return RouterError(
                503,
                f"upstream unavailable: {failure}",
                type="upstream_error",
                retry_after_seconds=failure.retry_after,
            )
        return RouterError(502, f"upstream failed: {failure}", type="upstream_error")

    async def _attempt(
        self,
        request: ClientRequest,
        plan: RoutePlan,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        send: Send,
        attempt: Attempt,
    ) -> _Answer:
        limits = self.limits
        # A stream's head comes with its first token; a whole answer's only once all of it is
        # generated, so its wait includes the answer's. A whole answer that timed out is not
        # tried on another pod (it may have run to its end; another pod would run it again).
        head_timeout = limits.first_byte_timeout_seconds
        if not stream:
            head_timeout += limits.max_answer_seconds
        loop = asyncio.get_running_loop()
        # One deadline for the head, the first chunk and a Responses stream's opening events
        # (each had the whole wait: a slow pod's first byte took up to twice the limit).
        first_byte_by = loop.time() + head_timeout
        try:
            response = await self.upstream.request(
                "POST",
                plan.endpoint.spec.url + path,
                body,
                [
                    (b"content-type", b"application/json"),
                    (b"x-request-id", request.request_id.encode()),
                    *_trace_headers(request.headers),
                    *self.core.state.pod_headers(plan.pool.key),
                ],
                connect_timeout=limits.connect_timeout_seconds,
                head_timeout=head_timeout,
            )
        except UpstreamError as exc:
            retry = stream or exc.kind != "timeout"
            raise _Retryable(exc.kind, str(exc), retry=retry) from exc
        try:
            if response.status >= 500:
                await _discard_error_body(response, limits.read_timeout_seconds)
                raise _Retryable(
                    "status",
                    f"HTTP {response.status}",
                    response.status,
                    retry_after=_retry_after(response.headers) if response.status == 503 else None,
                )
            chunks = response.chunks()
            try:
                async with asyncio.timeout_at(first_byte_by):
                    first = await anext(chunks, b"")
            except TimeoutError as exc:
                raise _Retryable("timeout", "no first byte in time", retry=stream) from exc
            except UpstreamError as exc:
                raise _Retryable(exc.kind, str(exc)) from exc
            content_type = _header(response.headers, b"content-type")
            streamed = stream and content_type.startswith(b"text/event-stream")
            # A background response goes on on its pod whatever happens to this connection: its
            # stream is not held (a retry would start a second one).
            background = request.body.get("background") is True
            if streamed and request.kind == "responses" and not background:
                first = await self._opening(first, chunks, first_byte_by)
            self.core.first_byte(plan, attempt, streamed=streamed)
            gap = limits.read_timeout_seconds
            # `max_answer_seconds` from the first byte; a whole answer's head already waited for
            # its generation, so all of it is also due by the head's deadline.
            until = loop.time() + limits.max_answer_seconds
            if not streamed:
                until = min(until, first_byte_by)
            headers = _response_headers(response.headers, plan, request.request_id)
            if streamed:
                tap = SseUsageTap(strip_usage_chunk=strip_usage)
                await send(
                    {"type": "http.response.start", "status": response.status, "headers": headers}
                )
                paced_chunks = paced(chunks, gap, until=until)
                completed = await self._stream(
                    first, paced_chunks, tap, send, plan, request.kind, response
                )
                return _Answer(response.status, tap.usage, completed, streamed=True)
            try:  # nothing reached the client yet: a failure here is retried
                payload = await join_chunks(
                    paced(chunks, gap, until=until), limits.max_response_bytes, first
                )
            except UpstreamError as exc:
                raise _Retryable(exc.kind, str(exc), retry=exc.kind != "too_large") from exc
            if response.status == 404 and _adapter_missing(plan, payload):
                raise _Retryable(ADAPTER_MISSING, "the pod has not loaded the adapter", 404)
            usage = usage_from_json_body(payload) if response.status == 200 else None
            headers.append((b"content-length", str(len(payload)).encode()))
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            await send({"type": "http.response.body", "body": payload})
            return _Answer(response.status, usage, completed=True, streamed=False)
        finally:
            await response.aclose()

    async def _opening(
        self, first: bytes, chunks: AsyncIterator[bytes], first_byte_by: float
    ) -> bytes:
        """A Responses API stream's opening events, held until its first output event arrives
        (`responses_stream.py`): that is its first byte. Returns what was held; a failure, the
        stream's end or `first_byte_by` (the loop's time) meanwhile is retryable (the client
        saw nothing)."""
        opening = OpeningEvents(self.limits.max_response_bytes)
        try:
            async with asyncio.timeout_at(first_byte_by):
                done = opening.feed(first)
                while not done:
                    chunk = await anext(chunks, None)
                    if chunk is None:
                        raise _Retryable("stream", "the stream ended before its first output")
                    done = opening.feed(chunk)
        except TimeoutError as exc:
            raise _Retryable("timeout", "no first output event in time") from exc
        except UpstreamError as exc:
            raise _Retryable(exc.kind, str(exc)) from exc
        return opening.held

    async def _stream(
        self,
        first: bytes,
        chunks: AsyncIterator[bytes],
        tap: SseUsageTap,
        send: Send,
        plan: RoutePlan,
        kind: str,
        response: UpstreamResponse,
    ) -> bool:
        try:
            out = tap.feed(first)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            async for chunk in chunks:
                out = tap.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except UpstreamError as exc:  # a broken read, a stall, an event that never ends
            self.core.broke(plan, exc.kind)
            log.warning("stream from %s broke after the first byte: %r", plan.endpoint.id, exc)
            # Too late to retry (output was sent); tell the client in the stream itself. An
            # unfinished event is dropped (a client would discard it too, and it would run into
            # the error event).
            message = f"the model server failed mid-stream ({exc.kind})"
            error = stream_error(kind, message, exc.kind)
            await _release(response)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": error})
            return False
        await send({"type": "http.response.body", "body": tap.flush()})
        return True


async def _release(response: UpstreamResponse) -> None:
    """Close a broken answer's pod connection before the client's response ends: once it has,
    uvicorn reports a disconnect, and the request's watcher would cancel a close that yields
    (an https pod's, in httpcore) halfway. Closing again later does nothing."""
    with contextlib.suppress(Exception):
        await response.aclose()


def stream_error(kind: str, message: str, code: str, status: int = 502) -> bytes:
    """The event that ends a stream broken after its first byte, in the shape of its API
    (`status`: the HTTP status the failure would have had, for Anthropic's error type)."""
    if kind == "responses":
        return error_event(message, code)
    if kind == "messages":
        payload = anthropic_error_body(status, message)
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    return b"data: " + error_bytes(message, "upstream_error", code) + b"\n\n"


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    for key, value in headers:
        if key == name:
            return value
    return b""


def _response_headers(
    upstream: list[tuple[bytes, bytes]], plan: RoutePlan, request_id: str
) -> list[tuple[bytes, bytes]]:
    headers = _passed_headers(upstream)
    headers.extend(plan_headers(plan, request_id))
    return headers


_TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context: vLLM's tracing reads it


def _trace_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The client's trace context, passed on to the pod."""
    return [
        (name.encode(), headers[name].encode("latin-1"))
        for name in _TRACE_HEADERS
        if name in headers
    ]


def _passed_headers(upstream: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A pod's response headers the client gets (the router sets framing and its own)."""
    return [
        (k, v)
        for k, v in upstream
        if k not in _DROP_RESPONSE_HEADERS and not k.startswith(b"x-kvgate-")
    ]


#: What every answer from a pod carries about the decision (`plan_headers`).
DECISION_HEADERS = (
    "x-kvgate-endpoint",
    "x-kvgate-pool",
    "x-kvgate-decision",
    "x-kvgate-prefix-hit-tokens",
)


_ENDPOINT, _POOL, _DECISION, _HITS = (name.encode() for name in DECISION_HEADERS)


def plan_headers(plan: RoutePlan, request_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (_ENDPOINT, plan.endpoint.id.encode()),
        (_POOL, plan.pool.key.encode()),
        (_DECISION, plan.decision.reason.encode()),
        (_HITS, str(plan.decision.predicted_hit_tokens).encode()),
        (b"x-request-id", request_id.encode()),
    ]
