"""One pod's warm-up and its phases: the state `warmup.py` and `warmup_claims.py` work on.

    warming ──(every warm request answered, or the deadline)──> ramping ──> warm

`WarmPods` holds the pods warming or ramping (`active`), and the warm ones until they leave
(`finished`, for `/debug/warm`). It hands out a pod's warm requests (`warm`) for the I/O side to
`take`, moves a pod on by the clock (`advance`: a warming pod past its deadline ramps, a ramping
one whose share of client requests reached 1 is warm) and keeps the
`kvgate_router_endpoint_warm_phase` gauge. Who warms a pod (`Role`) is decided by `warmup.py`
(this replica alone) or `warmup_claims.py` (shared across replicas); when a warm-up this replica
claimed for the others ends, the pod is queued in `claimed_ended` so that they are told.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kvgate.api.fleet import WarmupConfig
from kvgate.router.core.hot_prefixes import HotPrefix
from kvgate.router.metrics import RouterMetrics

Phase = Literal["warming", "ramping", "warm"]
#: who warms the pod: this replica alone (no sharing, or its fallback); its claim is being
#: decided; this replica, for every replica; another replica (followed)
Role = Literal["own", "claiming", "claimed", "following"]
WARM_PATH = "/v1/completions"


@dataclass(slots=True, eq=False)
class WarmRequest:
    """One prefix to put into one pod's cache."""

    endpoint_id: str
    pool: str
    prefix: HotPrefix
    joined_at: float = 0.0  # its pod's join (a pod that left and came back is another warm-up)
    deadline: float | None = None  # when it is no longer worth sending (None: its pod's warm-up's)
    copy: bool = False  # a copy of a hot prefix (`prefix_copies.py`), not part of a warm-up

    def body(self) -> dict[str, Any]:
        prefix = self.prefix
        prompt = prefix.tokens.tolist() if prefix.tokens is not None else prefix.text
        assert prompt is not None
        body: dict[str, Any] = {
            "model": prefix.model,
            "prompt": prompt,
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
    generation: str = ""
    role: Role = "own"
    warmed_by: str = ""  # the replica warming it, when another one does
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
            share = ramp_share(now - self.ramp_started_at, ramp_seconds)
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
            "role": self.role,
            "warmed_by": self.warmed_by or None,
        }


def ramp_share(elapsed: float, ramp_seconds: float) -> float:
    return 1.0 if ramp_seconds <= 0 else min(1.0, max(0.0, elapsed / ramp_seconds))


class WarmPods:
    """Every pod warming or ramping, and its phase (see the module docstring)."""

    def __init__(self, config: WarmupConfig, metrics: RouterMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.active: dict[str, PodWarmup] = {}  # warming or ramping
        self.finished: dict[str, PodWarmup] = {}  # warm now (kept for /debug until it leaves)
        self.claimed_ended: list[PodWarmup] = []  # claimed warm-ups that ended, to report
        self._ready: list[WarmRequest] = []  # for the I/O side to `take`

    def known(self, endpoint_id: str) -> PodWarmup | None:
        """The pod's warm-up, warming, ramping or warm (None: it left, or never warmed)."""
        return self.active.get(endpoint_id) or self.finished.get(endpoint_id)

    def add(self, pod: PodWarmup) -> None:
        self.active[pod.endpoint_id] = pod

    def remove(self, endpoint_id: str) -> PodWarmup | None:
        """The pod left: forget it and its warm requests not sent yet; its warm-up if active."""
        self.finished.pop(endpoint_id, None)
        pod = self.active.pop(endpoint_id, None)
        if pod is not None:
            self._ready = [r for r in self._ready if r.endpoint_id != endpoint_id]
            self._clear_phase(pod)
        return pod

    def warm(self, pod: PodWarmup, prefixes: list[HotPrefix], now: float) -> None:
        """Hand out the pod's warm requests (none: it ramps at once)."""
        if not prefixes:
            self.metrics.child(self.metrics.warmups, pod.pool, "nothing_hot").inc()
            self.start_ramp(pod, now)
            return
        pod.requests = pod.pending = len(prefixes)
        self._ready.extend(
            WarmRequest(pod.endpoint_id, pod.pool, prefix, pod.joined_at) for prefix in prefixes
        )
        self.set_phase(pod, "warming")

    def take(self) -> list[WarmRequest]:
        """Warm requests to send now (each exactly once)."""
        ready, self._ready = self._ready, []
        return ready

    def advance(self, pod: PodWarmup, now: float) -> float:
        """Move a warming or ramping pod on by the clock; its share of client requests now."""
        if pod.phase == "warming":
            if now < pod.deadline:
                return 0.0
            pod.timed_out = True
            self.metrics.child(self.metrics.warmups, pod.pool, "timed_out").inc()
            self.start_ramp(pod, now)
        assert pod.ramp_started_at is not None
        share = ramp_share(now - pod.ramp_started_at, self.config.ramp_seconds)
        if share >= 1.0:
            self._finish(pod)
        return share

    def start_ramp(self, pod: PodWarmup, now: float) -> None:
        if pod.role == "claimed":  # the other replicas follow this warm-up
            self.claimed_ended.append(pod)
        pod.ramp_started_at = now
        if self.config.ramp_seconds <= 0:
            self._finish(pod)
        else:
            self.set_phase(pod, "ramping")

    def set_phase(self, pod: PodWarmup, phase: Phase) -> None:
        pod.phase = phase
        gauge = self.metrics.endpoint_warm_phase
        for name in ("warming", "ramping"):
            self.metrics.child(gauge, pod.pool, pod.endpoint_id, name).set(name == phase)

    def _finish(self, pod: PodWarmup) -> None:
        pod.phase = "warm"
        self._clear_phase(pod)
        self.active.pop(pod.endpoint_id, None)
        self.finished[pod.endpoint_id] = pod

    def _clear_phase(self, pod: PodWarmup) -> None:
        gauge = self.metrics.endpoint_warm_phase
        for name in ("warming", "ramping"):
            self.metrics.child(gauge, pod.pool, pod.endpoint_id, name).set(0)
