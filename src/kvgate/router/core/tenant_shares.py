"""Tenants' shares of the pods: while several tenants are active, a tenant holding more than its
share of what is in flight may use only its weighted share of a request's candidate pods.

An engine runs the prefill chunks of the requests it already admitted before any new one (vLLM's
scheduler, FCFS), and its decodes fill its KV cache, so a short prompt sent to a pod busy with
another tenant's 4k- or 100k-token prompts waits for them, whatever order the router's queue
gave them. Fair queueing alone therefore cannot keep a tenant's TTFT when another tenant's long
prompts occupy every pod. This keeps pods free of the flooding tenant instead:

- a tenant is *active* while it sent a request within `fair_share_window_seconds`;
- with `A` the active tenants (the asking one included) and `w` their weights, tenant `t`'s
  share is `s_t = w_t / sum(w_A)`; a tenant holding more than `s_t` of the uncached prompt
  tokens this router has in flight may have requests in flight on `ceil(s_t * pods)` of the
  candidate pods (at least one), and past that only on pods where it has some already; a
  tenant within its share (the one sending short prompts) is never restricted;
- a request is in flight from the moment it is sent until it ends.

With one active tenant there is no limit (all capacity is used), so batch throughput with online
idle is what it was. The price: while the others are active, a flooding tenant runs on its share
of the pods only, even when they use less than theirs (an engine cannot be preempted, so the
pods they may need at any moment must stay free of it). Plain synchronous state on the routing
core's clock; bounded by the requests in flight and the configured tenants.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


class TenantShares:
    def __init__(self) -> None:
        self.window_seconds = 0.0
        self.weights: Mapping[str, float] = {}
        # attempt -> (tenant, endpoint, uncached tokens)
        self._in_flight: dict[object, tuple[str, str, int]] = {}
        self._pods: dict[str, dict[str, int]] = {}  # tenant -> endpoint -> attempts in flight
        self._tokens: dict[str, int] = {}  # tenant -> uncached tokens in flight
        self._last_seen: dict[str, float] = {}

    def configure(self, window_seconds: float, weights: Mapping[str, float]) -> None:
        self.window_seconds = window_seconds
        self.weights = weights
        # Only configured tenants (and the anonymous flow "") are remembered.
        self._last_seen = {t: at for t, at in self._last_seen.items() if t in weights or not t}

    def seen(self, tenant: str, now: float) -> None:
        if self.window_seconds > 0 and (tenant in self.weights or not tenant):
            self._last_seen[tenant] = now

    def started(self, attempt: object, tenant: str, endpoint: str, tokens: int) -> None:
        if self.window_seconds <= 0:
            return
        self._in_flight[attempt] = (tenant, endpoint, tokens)
        pods = self._pods.setdefault(tenant, {})
        pods[endpoint] = pods.get(endpoint, 0) + 1
        self._tokens[tenant] = self._tokens.get(tenant, 0) + tokens

    def ended(self, attempt: object) -> None:
        """The attempt ended (finished, failed or cancelled); idempotent."""
        found = self._in_flight.pop(attempt, None)
        if found is None:
            return
        tenant, endpoint, tokens = found
        # Attempts of 0 uncached tokens outlive the sum reaching 0: `get`, not `[]`.
        left_tokens = self._tokens.get(tenant, 0) - tokens
        if left_tokens > 0:
            self._tokens[tenant] = left_tokens
        else:
            self._tokens.pop(tenant, None)
        pods = self._pods[tenant]
        left = pods[endpoint] - 1
        if left:
            pods[endpoint] = left
        else:
            del pods[endpoint]
            if not pods:
                del self._pods[tenant]

    def allowed(
        self, tenant: str, endpoints: Iterable[str], now: float, extra: Iterable[str] = ()
    ) -> set[str] | None:
        """The endpoints (of `endpoints`) `tenant` may send to now; None: any. `extra`:
        endpoints granted to it but not sent yet (they count as in flight)."""
        window = self.window_seconds
        if window <= 0:
            return None
        active = [t for t, at in self._last_seen.items() if now - at <= window]
        if tenant not in active:
            active.append(tenant)
        if len(active) < 2:
            return None
        weights = self.weights
        share = weights.get(tenant, 1.0) / sum(weights.get(t, 1.0) for t in active)
        total = sum(self._tokens.get(t, 0) for t in active)
        if total <= 0 or self._tokens.get(tenant, 0) <= share * total:
            return None  # within its share of what is in flight
        candidates = list(endpoints)
        quota = max(1, math.ceil(share * len(candidates) - 1e-9))
        busy = {ep for ep in self._pods.get(tenant, {})} | set(extra)
        busy &= set(candidates)
        if len(busy) < quota:
            return None
        return busy
