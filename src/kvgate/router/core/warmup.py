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

Phases advance lazily against the core's clock (when the router next looks), so the same code
runs in real time and in simulated time. Plain synchronous code, one event loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.api.fleet import WarmupConfig
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.hot_prefixes import HotPrefix, HotPrefixes
from kvgate.router.metrics import RouterMetrics

Phase = Literal["warming", "ramping", "warm"]
WARM_PATH = "/v1/completions"


@dataclass(slots=True, eq=False)
class WarmRequest:
    """One prefix to put into one pod's cache."""

    endpoint_id: str
    pool: str
    prefix: HotPrefix
    joined_at: float = 0.0  # its pod's join (a pod that left and came back is another warm-up)

    def body(self) -> dict[str, Any]:
        prefix = self.prefix
        assert prefix.tokens is not None
        body: dict[str, Any] = {
            "model": prefix.model,
            "prompt": prefix.tokens.tolist(),
            "max_tokens": 1,
            "stream": False,
        }
        if prefix.cache_salt is not None:
            body["cache_salt"] = prefix.cache_salt
        return body


@dataclass(slots=True)
class PodWarmup:
    endpoint_id: str
    pool: str
    joined_at: float
    deadline: float
    phase: Phase = "warming"
    ramp_started_at: float | None = None
    requests: int = 0
    pending: int = 0
    succeeded: int = 0
    failed: int = 0
    prefill_tokens: int = 0
    timed_out: bool = False

    def describe(self, now: float, ramp_seconds: float) -> dict[str, Any]:
        share = 1.0 if self.phase == "warm" else 0.0
        if self.phase == "ramping" and self.ramp_started_at is not None:
            share = _ramp_share(now - self.ramp_started_at, ramp_seconds)
        return {
            "endpoint": self.endpoint_id,
            "pool": self.pool,
            "phase": self.phase,
            "traffic_share": round(share, 3),
            "seconds_since_join": round(now - self.joined_at, 3),
            "warm_requests": self.requests,
            "pending": self.pending,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "prefill_tokens": self.prefill_tokens,
            "timed_out": self.timed_out,
        }


def _ramp_share(elapsed: float, ramp_seconds: float) -> float:
    return 1.0 if ramp_seconds <= 0 else min(1.0, max(0.0, elapsed / ramp_seconds))


class Warmup:
    """Every joining pod's warm-up (see the module docstring). Owned by the routing core."""

    def __init__(self, config: WarmupConfig, metrics: RouterMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.hot = HotPrefixes(config)
        self._pods: dict[str, PodWarmup] = {}  # warming or ramping
        self._finished: dict[str, PodWarmup] = {}  # warm now (kept for /debug until it leaves)
        self._ready: list[WarmRequest] = []  # for the I/O side to `take`

    def configure(self, config: WarmupConfig) -> None:
        self.config = config
        self.hot.configure(config)

    # -- membership ----------------------------------------------------------------------

    def joined(self, ep: Endpoint, others: list[Endpoint], now: float) -> None:
        """`ep` joined its pool; `others`: the pool's endpoints that were there before (none:
        the router just started, or the pool was empty; nothing to shift traffic from)."""
        config = self.config
        if not config.enabled or not others:
            return
        prefixes = self.hot.top(ep.pool, config.top_prefixes, now)
        pod = PodWarmup(ep.id, ep.pool, now, now + config.timeout_seconds)
        self._pods[ep.id] = pod
        if not prefixes:
            self.metrics.child(self.metrics.warmups, ep.pool, "nothing_hot").inc()
            self._start_ramp(pod, now)
            return
        pod.requests = pod.pending = len(prefixes)
        requests = [WarmRequest(ep.id, ep.pool, prefix, now) for prefix in prefixes]
        self._ready.extend(requests)
        self._set_phase(pod, "warming")

    def left(self, ep: Endpoint) -> None:
        self._finished.pop(ep.id, None)
        pod = self._pods.pop(ep.id, None)
        if pod is not None:
            self._ready = [r for r in self._ready if r.endpoint_id != ep.id]
            self._clear_phase(pod)

    def take(self) -> list[WarmRequest]:
        """Warm requests to send now (each exactly once)."""
        ready, self._ready = self._ready, []
        return ready

    def request_done(
        self, request: WarmRequest, now: float, *, ok: bool, prompt_tokens: int = 0
    ) -> None:
        """A warm request was answered (`ok`: a 200) or failed, timed out or was abandoned."""
        result = "ok" if ok else "error"
        self.metrics.child(self.metrics.warm_requests, request.pool, result).inc()
        pod = self._pods.get(request.endpoint_id)
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
            self._start_ramp(pod, now)

    def deadline(self, endpoint_id: str) -> float | None:
        """When the pod's warm-up gives up (None: it is not warming)."""
        pod = self._pods.get(endpoint_id)
        return pod.deadline if pod is not None and pod.phase == "warming" else None

    # -- routing -------------------------------------------------------------------------

    def admits(self, endpoint_id: str, now: float, rng: random.Random) -> bool:
        """May a client request go to this endpoint now? (Hot path: one dict lookup when no pod
        is warming.)"""
        if not self._pods:
            return True
        pod = self._pods.get(endpoint_id)
        if pod is None:
            return True
        share = self._advance(pod, now)
        return share >= 1.0 or (share > 0.0 and rng.random() < share)

    def debug(self, now: float, endpoints: Iterable[Endpoint]) -> dict[str, Any]:
        """Every endpoint's warm state and each pool's hottest prefixes, for `/debug/warm`."""
        ramp, half_life = self.config.ramp_seconds, self.config.half_life_seconds
        states = []
        pools: set[str] = set()
        for ep in endpoints:
            pools.add(ep.pool)
            pod = self._pods.get(ep.id)
            if pod is not None:
                self._advance(pod, now)
            pod = self._pods.get(ep.id) or self._finished.get(ep.id)
            if pod is None:
                states.append({"endpoint": ep.id, "pool": ep.pool, "phase": "warm"})
            else:
                states.append(pod.describe(now, ramp))
        top = {
            pool: [
                {
                    "model": p.model,
                    "tenant": p.tenant,
                    "tokens": p.token_count,
                    "requests": round(p.decayed(now, half_life), 2),
                }
                for p in self.hot.top(pool, self.config.top_prefixes, now)
            ]
            for pool in sorted(pools)
        }
        return {
            "enabled": self.config.enabled,
            "endpoints": states,
            "hot_prefixes": len(self.hot),
            "hot_prefix_bytes": self.hot.bytes,
            "top": top,
        }

    # -- phases --------------------------------------------------------------------------

    def _advance(self, pod: PodWarmup, now: float) -> float:
        """Move a warming or ramping pod on by the clock; its share of client requests now."""
        if pod.phase == "warming":
            if now < pod.deadline:
                return 0.0
            pod.timed_out = True
            self.metrics.child(self.metrics.warmups, pod.pool, "timed_out").inc()
            self._start_ramp(pod, now)
        assert pod.ramp_started_at is not None
        share = _ramp_share(now - pod.ramp_started_at, self.config.ramp_seconds)
        if share >= 1.0:
            self._finish(pod)
        return share

    def _start_ramp(self, pod: PodWarmup, now: float) -> None:
        pod.ramp_started_at = now
        if self.config.ramp_seconds <= 0:
            self._finish(pod)
        else:
            self._set_phase(pod, "ramping")

    def _finish(self, pod: PodWarmup) -> None:
        pod.phase = "warm"
        self._clear_phase(pod)
        self._pods.pop(pod.endpoint_id, None)
        self._finished[pod.endpoint_id] = pod

    def _set_phase(self, pod: PodWarmup, phase: Phase) -> None:
        pod.phase = phase
        gauge = self.metrics.endpoint_warm_phase
        for name in ("warming", "ramping"):
            self.metrics.child(gauge, pod.pool, pod.endpoint_id, name).set(name == phase)

    def _clear_phase(self, pod: PodWarmup) -> None:
        gauge = self.metrics.endpoint_warm_phase
        for name in ("warming", "ramping"):
            self.metrics.child(gauge, pod.pool, pod.endpoint_id, name).set(0)
