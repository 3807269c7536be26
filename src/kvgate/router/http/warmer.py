"""Send warm requests: a prefix, `max_tokens: 1`, to one pod, so it computes and caches it.

`send_warm` is one request (the admin API's `/admin/warm` and the warmer share it). `Warmer` is
the live router's background side of `core/warmup.py`: after the endpoint set changes, and when
the core queued a copy of a hot prefix (`core/prefix_copies.py`), it takes the core's warm
requests and sends them, at most `warmup.concurrency` at a time across every pod, each bounded
by its deadline (its pod's warm-up's, or the copy's own) and
`limits.first_byte_timeout_seconds`, and reports each answer (or failure) back to the core. Its
tasks are owned: `stop()` cancels and awaits them, and a `dispatch` after it starts none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvgate.api.router_config import LimitsConfig
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.core.warmup_pods import WARM_PATH, WarmRequest
from kvgate.router.http.upstream import Upstream, UpstreamError, read_all
from kvgate.router.http.usage import usage_from_json_body
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]


async def send_warm(
    upstream: Upstream,
    url: str,
    path: str,
    payload: bytes,
    limits: LimitsConfig,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    within_seconds: float | None = None,
) -> dict[str, Any]:
    """POST one warm request; answers `{status, prompt_tokens, cached_tokens}` or `{status:
    None, error}` (never raises for the pod's failures). `headers`: the pod's own (its API
    key: `RouterState.pod_headers`)."""
    head_timeout = limits.first_byte_timeout_seconds
    if within_seconds is not None:
        head_timeout = min(head_timeout, within_seconds)
    try:
        async with asyncio.timeout(head_timeout + limits.connect_timeout_seconds):
            response = await upstream.request(
                "POST",
                url + path,
                payload,
                [*_JSON, *headers],
                connect_timeout=limits.connect_timeout_seconds,
                head_timeout=head_timeout,
            )
            content = await read_all(response)
    except (UpstreamError, TimeoutError) as exc:
        return {"status": None, "error": str(exc) or type(exc).__name__}
    usage = usage_from_json_body(content)
    return {
        "status": response.status,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": usage.cached_tokens if usage else None,
    }


PAYLOAD_SLICE_TOKENS = 32_768
"""Token ids encoded between two yields to the event loop (~5 ms): a copy of a 1M-token prompt's
prefix encoded in one piece held the loop for 0.2 s."""
PAYLOAD_SLICE_CHARS = 1 << 18
"""Characters of a text prompt (a copy with approximate keys) encoded between two yields."""


async def warm_payload(request: WarmRequest) -> bytes:
    """`request.body()` as compact JSON, its prompt (token ids or text) encoded a slice at a
    time."""
    body = request.body()
    prompt = body.pop("prompt")
    head = json.dumps(body, separators=(",", ":")).encode()
    if isinstance(prompt, str):  # slices of a str never split a character's escape
        parts = [head[:-1], b',"prompt":"']
        for start in range(0, len(prompt), PAYLOAD_SLICE_CHARS):
            if start:
                await asyncio.sleep(0)
            parts.append(json.dumps(prompt[start : start + PAYLOAD_SLICE_CHARS])[1:-1].encode())
        parts.append(b'"}')
        return b"".join(parts)
    parts = [head[:-1], b',"prompt":[']
    for start in range(0, len(prompt), PAYLOAD_SLICE_TOKENS):
        if start:
            await asyncio.sleep(0)  # others' turn between two slices
            parts.append(b",")
        parts.append(",".join(map(str, prompt[start : start + PAYLOAD_SLICE_TOKENS])).encode())
    parts.append(b"]}")
    return b"".join(parts)


class Warmer:
    """Sends the routing core's warm requests (see the module docstring)."""

    def __init__(
        self,
        core: RoutingCore,
        upstream: Upstream,
        limits: Callable[[], LimitsConfig],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.upstream = upstream
        self._limits = limits
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(core.warmup.config.concurrency)
        self._concurrency = core.warmup.config.concurrency
        self._stopped = False

    def dispatch(self) -> None:
        """Start sending whatever the core has to warm (call after the endpoint set changed, and
        when the core queued a copy); nothing once stopped (the upstream is closing: a task made
        now would outlive `stop`)."""
        if self._stopped:
            return
        concurrency = self.core.warmup.config.concurrency
        if concurrency != self._concurrency:  # reloaded: new requests queue on new slots
            self._slots, self._concurrency = asyncio.Semaphore(concurrency), concurrency
        for request in self.core.warmup.take():
            task = asyncio.create_task(self._send(request), name="kvgate-warm")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, request: WarmRequest) -> None:
        warmup = self.core.warmup
        ok, tokens = False, 0
        slots = self._slots
        try:
            if not await self._slot(slots, request):
                return  # its deadline passed while it waited: it counts on its pod no longer
            try:
                ep = self.core.endpoints.get(request.endpoint_id)
                deadline = warmup.request_deadline(request)
                remaining = None if deadline is None else deadline - self._clock()
                if ep is None or remaining is None or remaining <= 0:
                    return  # left, or its warm-up (or copy) ended while this one waited
                payload = await warm_payload(request)
                result = await send_warm(
                    self.upstream,
                    ep.spec.url,
                    WARM_PATH,
                    payload,
                    self._limits(),
                    headers=self.core.state.pod_headers(ep.pool),
                    within_seconds=remaining,
                )
                ok = result["status"] == 200
                tokens = result.get("prompt_tokens") or 0
                if not ok:
                    log.info("warm request to %s failed: %s", ep.id, result)
            finally:
                slots.release()
        finally:
            warmup.request_done(request, self._clock(), ok=ok, prompt_tokens=tokens)

    async def _slot(self, slots: asyncio.Semaphore, request: WarmRequest) -> bool:
        """One of the `concurrency` send slots, or False once the request's deadline passes
        while it waits (a copy's is counted from when it was proposed)."""
        deadline = self.core.warmup.request_deadline(request)
        if deadline is None:
            return False
        try:
            async with asyncio.timeout(deadline - self._clock()):
                await slots.acquire()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        self._stopped = True
        await cancel_and_wait(*self._tasks)
