"""Warm pods that join a pool before they take their full share of traffic.

    joined ──> warming ──(every warm request answered, or the timeout)──> ramping ──> warm
          └──(a pool with no other pod, nothing hot, warm-up off)──────────────────> warm

- `joined(ep, now)`: a pod joined a pool that has other pods (scale-up, restart, replacement).
  The pool's top prefixes (`hot_prefixes.py`) become warm requests: `/v1/completions` with the
  prefix as token ids, `max_tokens: 1`, the prefix's own model name (its LoRA adapter) and
  cache salt, so the engine computes and caches exactly those blocks. The I/O side (the live
  router's `http/warmer.py`, or the discrete-event bench) `take`s them, sends them at most
  `concurrency` at a time, and reports each with `request_done`.
- While **warming** a pod gets no client requests (unless every pod of its pool is warming:
  the router fails open). When its last warm request is answered, or `timeout_seconds` after it
  joined (a pod that never answers does not stay out of rotation), it is **ramping**: each
  client request may go to it with probability (time since ramp start) / `ramp_seconds`, so the
  pool's new, idle pods do not take every request at once. Then it is **warm**.

With **shared** warm-ups (router replicas on the Redis directory, `warmup.shared`), a joining
pod is warmed once for all replicas: it is held back while its claim is decided, and who warms
it is `claims`' (`warmup_claims.py`). The pods and their phases are `pods`'
(`warmup_pods.py`); this module is the routing core's one entry point to both.

The copies of hot prefixes the routing core starts (`prefix_copies.py`) go out the same way:
`take` hands them out with the warm requests, `request_done` ends them.

Phases advance lazily against the core's clock (when the router next looks), so the same code
runs in real time and in simulated time. Plain synchronous code, one event loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from kvgate.api.fleet import WarmupConfig
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.hot_prefixes import HotPrefixes
from kvgate.router.core.peer_prefixes import PeerPrefixCounts, shared_counts_ttl_seconds
from kvgate.router.core.prefix_copies import PrefixCopies
from kvgate.router.core.warmup_claims import WarmClaims
from kvgate.router.core.warmup_pods import PodWarmup, WarmPods, WarmRequest
from kvgate.router.metrics import RouterMetrics


class Warmup:
    """Every joining pod's warm-up (see the module docstring). Owned by the routing core."""

    def __init__(
        self,
        config: WarmupConfig,
        metrics: RouterMetrics,
        copies: PrefixCopies,
        *,
        shared: bool = False,
    ) -> None:
        self.config = config
        self.copies = copies
        self.metrics = metrics
        self.shared = shared  # warm-ups are claimed and followed across replicas
        self.peer_counts = PeerPrefixCounts(shared_counts_ttl_seconds(config))
        self.hot = HotPrefixes(config, self.peer_counts)
        self.pods = WarmPods(config, metrics)
        self.claims = WarmClaims(self.pods, self.hot, self.peer_counts)

    def configure(self, config: WarmupConfig, *, shared: bool | None = None) -> None:
        self.config = config
        self.hot.configure(config)
        self.pods.config = config
        self.peer_counts.ttl_seconds = shared_counts_ttl_seconds(config)
        if shared is not None:
            self.shared = shared

    def forget_pool(self, pool: str) -> None:
        """`pool` left the configuration: drop its hot prefixes and the others' counts."""
        self.hot.forget_pool(pool)
        self.peer_counts.forget_pool(pool)

    # -- membership ----------------------------------------------------------------------

    def joined(self, ep: Endpoint, others: list[Endpoint], now: float) -> None:
        """`ep` joined its pool; `others`: the pool's endpoints that were there before (none:
        the router just started, or the pool was empty; nothing to shift traffic from)."""
        config = self.config
        if not config.enabled or not others:
            return
        deadline = now + config.timeout_seconds
        pod = PodWarmup(ep.id, ep.pool, now, deadline, generation=ep.spec.generation)
        self.pods.add(pod)
        if self.shared:  # held back while its claim is decided
            self.claims.joined(pod)
            return
        self.pods.warm(pod, self.hot.top(ep.pool, config.top_prefixes, now), now)

    def left(self, ep: Endpoint) -> None:
        pod = self.pods.remove(ep.id)
        if pod is not None:
            self.claims.left(pod)

    def take(self) -> list[WarmRequest]:
        """Warm requests and prefix copies to send now (each exactly once)."""
        return self.pods.take() + self.copies.take()

    def request_done(
        self, request: WarmRequest, now: float, *, ok: bool, prompt_tokens: int = 0
    ) -> None:
        """A warm request was answered (`ok`: a 200) or failed, timed out or was abandoned."""
        if request.copy:
            self.copies.done(request, ok=ok)
            return
        result = "ok" if ok else "error"
        self.metrics.child(self.metrics.warm_requests, request.pool, result).inc()
        pod = self.pods.active.get(request.endpoint_id)
        if pod is None or pod.phase != "warming" or pod.joined_at != request.joined_at:
            return
        pod.pending -= 1
        if ok:
            pod.succeeded += 1
            pod.prefill_tokens += prompt_tokens
            self.metrics.child(self.metrics.warm_prefill_tokens, request.pool).inc(prompt_tokens)
        else:
            pod.failed += 1
        if pod.pending <= 0:
            self.metrics.child(self.metrics.warmups, pod.pool, "warmed").inc()
            self.pods.start_ramp(pod, now)

    def request_deadline(self, request: WarmRequest) -> float | None:
        """When the request is no longer worth sending (None: never, or its warm-up ended)."""
        if request.deadline is not None:
            return request.deadline
        return self.deadline(request.endpoint_id)

    def deadline(self, endpoint_id: str) -> float | None:
        """When the pod's warm-up gives up (None: it is not warming)."""
        pod = self.pods.active.get(endpoint_id)
        return pod.deadline if pod is not None and pod.phase == "warming" else None

    # -- routing -------------------------------------------------------------------------

    def admits(self, endpoint_id: str, now: float, rng: random.Random) -> bool:
        """May a client request go to this endpoint now? (Hot path: one dict lookup when no pod
        is warming.)"""
        active = self.pods.active
        if not active:
            return True
        pod = active.get(endpoint_id)
        if pod is None:
            return True
        share = self.pods.advance(pod, now)
        return share >= 1.0 or (share > 0.0 and rng.random() < share)

    def advance_all(self, now: float) -> None:
        """Move every warming or ramping pod on by the clock (routing does it for the pods it
        asks about; a quiet pool's phases and timeouts would wait for its next request)."""
        for pod in list(self.pods.active.values()):
            self.pods.advance(pod, now)

    def debug(
        self, now: float, endpoints: Iterable[Endpoint], *, tenants: bool = True
    ) -> dict[str, Any]:
        """Every endpoint's warm state and each pool's hottest prefixes, for `/debug/warm`;
        without `tenants`, only the prefixes of requests that named no tenant."""
        ramp, half_life = self.config.ramp_seconds, self.config.half_life_seconds
        states = []
        pools: set[str] = set()
        for ep in endpoints:
            pools.add(ep.pool)
            pod = self.pods.active.get(ep.id)
            if pod is not None:
                self.pods.advance(pod, now)
            pod = self.pods.known(ep.id)
            if pod is None:
                states.append({"endpoint": ep.id, "pool": ep.pool, "phase": "warm"})
            else:
                states.append(pod.describe(now, ramp))
        top = {}
        for pool in sorted(pools):
            peers = self.peer_counts.counts(pool, now)
            top[pool] = [
                {
                    "model": p.model,
                    "tenant": p.tenant,
                    "tokens": p.token_count,
                    "requests": round(p.decayed(now, half_life), 2),
                    "peer_requests": round(peers.get(p.key, 0.0), 2),
                }
                for p in self.hot.top(pool, self.config.top_prefixes, now, peer_counts=peers)
                if tenants or p.tenant is None
            ]
        return {
            "enabled": self.config.enabled,
            "shared": self.shared,
            "peer_replicas": {pool: self.peer_counts.replicas(pool, now) for pool in sorted(pools)},
            "endpoints": states,
            "hot_prefixes": len(self.hot),
            "hot_prefix_bytes": self.hot.bytes,
            "top": top,
        }
