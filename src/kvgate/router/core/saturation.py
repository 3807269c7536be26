"""When a pod has room for another request (flow control's saturation rule).

A pod has room for `max_waiting_requests - backlog` more requests, where the backlog is the
larger of what its engine reports waiting (`vllm:num_requests_waiting`, scraped, while fresh)
and this router's own requests on it not yet past their prefill (which also covers what it sent
since the last scrape). It has none while its scraped KV cache usage is at `max_kv_cache_usage`,
while this router's unprefilled tokens on it reach `max_pending_prefill_tokens` (an idle pod
always takes one request), or while it is ejected (unless every candidate is: it fails open, as
routing does) or draining. Slots granted to queued requests
not sent yet are reserved with the tokens they will prefill there (`reserve` / `release`): they
count as this router's requests and tokens on the pod, so one dispatch does not grant a pod a
60k-token prompt and then the short ones queued behind it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvgate.api.router_config import FlowControlConfig
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.accounting import Accounting


class Saturation:
    def __init__(self, accounting: Accounting) -> None:
        self._accounting = accounting
        # endpoint id -> (slots, uncached prompt tokens) granted to waiters not sent yet
        self._reserved: dict[str, tuple[int, int]] = {}
        self.limits = FlowControlConfig()
        self.stale_after_seconds = 2.0

    def configure(self, limits: FlowControlConfig, stale_after_seconds: float) -> None:
        self.limits = limits
        self.stale_after_seconds = stale_after_seconds

    def slots(self, ep: Endpoint, now: float, *, fail_open: bool) -> int:
        """How many more requests `ep` takes before it is saturated (reservations deducted).
        `fail_open`: every candidate is ejected (`every_one_ejected`), so no ejection counts."""
        if ep.draining or not (fail_open or ep.healthy(now)):
            return 0
        limits = self.limits
        own = self._accounting.load(ep.id, now)
        reserved, reserved_tokens = self._reserved.get(ep.id, (0, 0))
        if (own.pending_prefill_requests or reserved) and (
            own.pending_prefill_tokens + reserved_tokens >= limits.max_pending_prefill_tokens
        ):
            return 0
        backlog = own.pending_prefill_requests
        if ep.load_fresh(now, self.stale_after_seconds):
            full = limits.max_kv_cache_usage
            if full < 1 and ep.load.kv_cache_usage >= full:  # 1 disables (vLLM reports 1.0)
                return 0
            backlog = max(backlog, int(ep.load.waiting))
        return max(0, limits.max_waiting_requests - backlog - reserved)

    def any_room(self, endpoints: Iterable[Endpoint], now: float, *, fail_open: bool) -> bool:
        """Some endpoint of `endpoints` has a free slot (stops at the first)."""
        return any(self.slots(ep, now, fail_open=fail_open) > 0 for ep in endpoints)

    def room(self, endpoints: Iterable[Endpoint], now: float, *, fail_open: bool) -> dict[str, int]:
        """Endpoint id -> free slots, for the endpoints that have any."""
        out = {}
        for ep in endpoints:
            n = self.slots(ep, now, fail_open=fail_open)
            if n > 0:
                out[ep.id] = n
        return out

    def reserve(self, endpoint_id: str, tokens: int) -> None:
        """A slot on `endpoint_id` for a request that will prefill `tokens` there."""
        slots, held = self._reserved.get(endpoint_id, (0, 0))
        self._reserved[endpoint_id] = (slots + 1, held + tokens)

    def release(self, endpoint_id: str, tokens: int) -> None:
        slots, held = self._reserved.get(endpoint_id, (0, 0))
        if slots > 1:
            self._reserved[endpoint_id] = (slots - 1, max(0, held - tokens))
        else:
            self._reserved.pop(endpoint_id, None)

    @property
    def reserved(self) -> dict[str, int]:
        """Slots reserved per endpoint (for tests and /debug)."""
        return {ep: slots for ep, (slots, _) in self._reserved.items()}
