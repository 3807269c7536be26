"""Send a planned request to its pod and stream the answer back; retry before the first byte.

One attempt:
1. Account the request on the pod: in-flight +1, pending prefill +1 request / +uncached tokens.
2. POST the body; wait for the response head and its first body chunk (bounded by
   `first_byte_timeout`). Nothing has reached the client yet, so a connection failure, a timeout
   or a 5xx from the pod is retried on another pod (re-planned without the pods already tried),
   up to `max_retries` times. The failing pod gets a passive-health failure.
3. At the first body byte: TTFT is measured, pending prefill is released (non-streaming answers
   release it at their predicted TTFT instead, since their first byte is their last), the
   response head goes to the client with the `x-kvgate-*` headers.
4. The rest streams through as it arrives (each gap bounded by `read_timeout`). Usage is read on
   the way (`usage.py`). A pod failing after the first byte cannot be retried without
   duplicating output: a stream ends with an OpenAI error event instead of `[DONE]`.

Cancellation (the client went away) propagates into the upstream request, which closes the
connection to the pod, and vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from kvgate.api.router_config import LimitsConfig
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.errors import RouterError, error_bytes
from kvgate.router.core.routing import RoutePlan
from kvgate.router.http.upstream import Upstream, UpstreamError, read_all
from kvgate.router.http.usage import SseUsageTap, Usage, usage_from_json_body
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

Send = Callable[[dict[str, object]], Awaitable[None]]
Replan = Callable[[list[str]], Awaitable[RoutePlan]]

_DROP_RESPONSE_HEADERS = {
    b"content-length",
    b"transfer-encoding",
    b"connection",
    b"keep-alive",
    b"date",
    b"server",
}


@dataclass
class Outcome:
    """What the learner needs to know about a finished request."""

    plan: RoutePlan
    status: int
    ttft_seconds: float | None  # streaming only: first byte of the stream
    duration_seconds: float
    usage: Usage | None
    retries: int
    queued_ahead: int  # router-known requests ahead on the pod when sent
    completed: bool  # the whole response reached the client


class _Retryable(Exception):
    def __init__(self, kind: str, detail: str, status: int = 502) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status = status


class Proxy:
    def __init__(self, upstream: Upstream, metrics: RouterMetrics, limits: LimitsConfig) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.limits = limits

    async def forward(
        self,
        plan: RoutePlan,
        path: str,
        body: bytes,
        *,
        stream: bool,
        strip_usage: bool,
        request_id: str,
        send: Send,
        replan: Replan,
    ) -> Outcome:
        tried: list[str] = []
        retries = 0
        started = time.perf_counter()
        while True:
            ep = plan.endpoint
            tried.append(ep.id)
            try:
                return await self._attempt(
                    plan, path, body, stream, strip_usage, request_id, send, started, retries
                )
            except _Retryable as failure:
                self.metrics.upstream_errors.labels(plan.pool.key, ep.id, failure.kind).inc()
                if ep.record_failure(
                    time.monotonic(), self.limits.eject_after_failures, self.limits.eject_seconds
                ):
                    log.warning("endpoint %s ejected after repeated failures", ep.id)
                log.warning(
                    "request %s: %s failed before the first byte (%s: %s)",
                    request_id,
                    ep.id,
                    failure.kind,
                    failure,
                )
                if retries >= self.limits.max_retries:
                    raise self._final_error(failure) from None
                try:
                    plan = await replan(tried)
                except RouterError:
                    raise self._final_error(failure) from None
                retries += 1
                self.metrics.retries.labels(plan.pool.key).inc()

    @staticmethod
    def _final_error(failure: _Retryable) -> RouterError:
        if failure.kind == "timeout":
            return RouterError(504, f"upstream timed out: {failure}", type="upstream_error")
        return RouterError(502, f"upstream failed: {failure}", type="upstream_error")

    async def _attempt(
        self,
        plan: RoutePlan,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        request_id: str,
        send: Send,
        started: float,
        retries: int,
    ) -> Outcome:
        ep = plan.endpoint
        limits = self.limits
        uncached = plan.uncached_tokens
        queued_ahead = ep.pending_prefill_requests
        ep.inflight += 1
        ep.pending_prefill_requests += 1
        ep.pending_prefill_tokens += uncached
        inflight_gauge = self.metrics.child(self.metrics.inflight, plan.pool.key, ep.id)
        inflight_gauge.inc()
        released = False
        release_timer: asyncio.TimerHandle | None = None

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                ep.pending_prefill_requests -= 1
                ep.pending_prefill_tokens -= uncached

        try:
            try:
                response = await self.upstream.request(
                    "POST",
                    ep.spec.url + path,
                    body,
                    [
                        (b"content-type", b"application/json"),
                        (b"x-request-id", request_id.encode()),
                    ],
                    connect_timeout=limits.connect_timeout_seconds,
                    head_timeout=limits.first_byte_timeout_seconds,
                )
            except UpstreamError as exc:
                raise _Retryable(exc.kind, str(exc)) from exc
            try:
                if response.status >= 500:
                    with contextlib.suppress(UpstreamError):
                        await read_all(response)
                    raise _Retryable("status", f"HTTP {response.status}", response.status)
                chunks = response.chunks()
                try:
                    async with asyncio.timeout(limits.first_byte_timeout_seconds):
                        first = await anext(chunks, b"")
                except TimeoutError as exc:
                    raise _Retryable("timeout", "no first byte in time") from exc
                except UpstreamError as exc:
                    raise _Retryable(exc.kind, str(exc)) from exc
                first_byte_at = time.perf_counter()
                ep.record_success()
                content_type = _header(response.headers, b"content-type")
                is_sse = content_type.startswith(b"text/event-stream")
                if stream and is_sse:
                    release()
                else:
                    delay = max(0.0, plan.decision.predicted_ttft_seconds)
                    release_timer = asyncio.get_running_loop().call_later(delay, release)
                headers = _response_headers(response.headers, plan, request_id)
                ttft: float | None = None
                if stream and is_sse:
                    tap = SseUsageTap(strip_usage_chunk=strip_usage)
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": headers,
                        }
                    )
                    completed = await self._stream(first, chunks, tap, send, plan)
                    usage = tap.usage
                    ttft = first_byte_at - started
                else:
                    parts = [first]
                    try:
                        async for chunk in chunks:
                            parts.append(chunk)
                    except UpstreamError as exc:
                        raise _Retryable(exc.kind, str(exc)) from exc
                    payload = b"".join(parts)
                    usage = usage_from_json_body(payload) if response.status == 200 else None
                    headers.append((b"content-length", str(len(payload)).encode()))
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": headers,
                        }
                    )
                    await send({"type": "http.response.body", "body": payload})
                    completed = True
                return Outcome(
                    plan=plan,
                    status=response.status,
                    ttft_seconds=ttft,
                    duration_seconds=time.perf_counter() - started,
                    usage=usage,
                    retries=retries,
                    queued_ahead=queued_ahead,
                    completed=completed,
                )
            finally:
                await response.aclose()
        finally:
            if release_timer is not None and not released:
                release_timer.cancel()
            release()
            ep.inflight -= 1
            inflight_gauge.dec()

    async def _stream(
        self,
        first: bytes,
        chunks: AsyncIterator[bytes],
        tap: SseUsageTap,
        send: Send,
        plan: RoutePlan,
    ) -> bool:
        read_timeout = self.limits.read_timeout_seconds
        out = tap.feed(first)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
        ep: Endpoint = plan.endpoint
        while True:
            try:
                async with asyncio.timeout(read_timeout):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except (TimeoutError, UpstreamError) as exc:
                kind = "timeout" if isinstance(exc, TimeoutError) else "stream"
                self.metrics.upstream_errors.labels(plan.pool.key, ep.id, kind).inc()
                log.warning("stream from %s broke after the first byte: %r", ep.id, exc)
                # Too late to retry (output was sent); tell the client in the stream itself.
                message = f"the model server failed mid-stream ({kind})"
                error = b"data: " + error_bytes(message, "upstream_error", kind) + b"\n\n"
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": tap.flush() + error})
                return False
            out = tap.feed(chunk)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
        await send({"type": "http.response.body", "body": tap.flush()})
        return True


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    for key, value in headers:
        if key == name:
            return value
    return b""


def _response_headers(
    upstream: list[tuple[bytes, bytes]], plan: RoutePlan, request_id: str
) -> list[tuple[bytes, bytes]]:
    headers = [
        (k, v)
        for k, v in upstream
        if k not in _DROP_RESPONSE_HEADERS and not k.startswith(b"x-kvgate-")
    ]
    headers.extend(plan_headers(plan, request_id))
    return headers


def plan_headers(plan: RoutePlan, request_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-kvgate-endpoint", plan.endpoint.id.encode()),
        (b"x-kvgate-pool", plan.pool.key.encode()),
        (b"x-kvgate-decision", plan.decision.reason.encode()),
        (b"x-kvgate-prefix-hit-tokens", str(plan.decision.predicted_hit_tokens).encode()),
        (b"x-request-id", request_id.encode()),
    ]
