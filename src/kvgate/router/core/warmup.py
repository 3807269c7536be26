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
pod is warmed once for all replicas. It is held back (warming) while its claim is decided:

- `take_claims()`: the I/O side (`http/warm_sharing.py`, or the bench in process) claims each
  pod in the directory (`kvgate.directory.shared_warmup`) and reports with `claim_result`:
  **claimed**: this replica warms it, with the prefixes it knows ranked by every replica's
  request counts (`peer_prefixes.py`); when that warm-up ends (answered, or timed out) the pod
  is in `take_reports()` to be marked done. **follow**: another replica warms it; the pod stays
  out of rotation here until `following()`'s poll (`follow_result`) finds the claim done (or
  gone), or this replica's own `timeout_seconds` passes, then it ramps as if warmed here.
  **done**: warmed already (this replica heard of the pod late): ramp. **nothing**: no replica
  claimed it and this one has nothing hot: ramp, as without sharing.
- **failed** (Redis down or slow, at the claim or while following): the pod is warmed from this
  replica's own history, exactly as without sharing, within the same deadline.

Phases advance lazily against the core's clock (when the router next looks), so the same code
runs in real time and in simulated time. Plain synchronous code, one event loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.api.fleet import WarmupConfig
from kvgate.directory.shared_warmup import ClaimOutcome, ClaimState
from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.hot_prefixes import HotPrefix, HotPrefixes
from kvgate.router.core.peer_prefixes import PeerPrefixCounts, shared_counts_ttl_seconds
from kvgate.router.metrics import RouterMetrics

Phase = Literal["warming", "ramping", "warm"]
#: who warms the pod: this replica alone (no sharing, or its fallback); its claim is being
#: decided; this replica, for every replica; another replica (followed)
Role = Literal["own", "claiming", "claimed", "following"]
WARM_PATH = "/v1/completions"
#: a finished claim stays readable this long, for replicas that hear of the pod late
DONE_GRACE_SECONDS = 10.0
#: how often a replica reads the claims it follows
FOLLOW_POLL_SECONDS = 0.1


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


@dataclass(slots=True, frozen=True)
class WarmClaim:
    """A joining pod's warm-up as replicas share it (`kvgate.directory.shared_warmup`)."""

    endpoint_id: str
    pool: str
    generation: str  # the pod's (a replaced pod is another warm-up)
    joined_at: float  # this replica's join (matches the answer to the warm-up it was for)
    can_warm: bool = False  # this replica has prefixes to warm it with


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
            "role": self.role,
            "warmed_by": self.warmed_by or None,
        }

    def claim(self, *, can_warm: bool = False) -> WarmClaim:
        return WarmClaim(self.endpoint_id, self.pool, self.generation, self.joined_at, can_warm)


def _ramp_share(elapsed: float, ramp_seconds: float) -> float:
    return 1.0 if ramp_seconds <= 0 else min(1.0, max(0.0, elapsed / ramp_seconds))


class Warmup:
    """Every joining pod's warm-up (see the module docstring). Owned by the routing core."""

    def __init__(
        self, config: WarmupConfig, metrics: RouterMetrics, *, shared: bool = False
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.shared = shared  # warm-ups are claimed and followed across replicas
        self.peer_counts = PeerPrefixCounts(shared_counts_ttl_seconds(config))
        self.hot = HotPrefixes(config, self.peer_counts)
        self._pods: dict[str, PodWarmup] = {}  # warming or ramping
        self._finished: dict[str, PodWarmup] = {}  # warm now (kept for /debug until it leaves)
        self._ready: list[WarmRequest] = []  # for the I/O side to `take`
        self._claims: list[PodWarmup] = []  # shared: joined, to claim
        self._reports: list[PodWarmup] = []  # shared: claimed warm-ups that ended

    def configure(self, config: WarmupConfig, *, shared: bool | None = None) -> None:
        self.config = config
        self.hot.configure(config)
        self.peer_counts.ttl_seconds = shared_counts_ttl_seconds(config)
        if shared is not None:
            self.shared = shared

    # -- membership ----------------------------------------------------------------------

    def joined(self, ep: Endpoint, others: list[Endpoint], now: float) -> None:
        """`ep` joined its pool; `others`: the pool's endpoints that were there before (none:
        the router just started, or the pool was empty; nothing to shift traffic from)."""
        config = self.config
        if not config.enabled or not others:
            return
        deadline = now + config.timeout_seconds
        pod = PodWarmup(ep.id, ep.pool, now, deadline, generation=ep.spec.generation)
        self._pods[ep.id] = pod
        if self.shared:  # held back while its claim is decided
            pod.role = "claiming"
            self._claims.append(pod)
            self._set_phase(pod, "warming")
            return
        self._warm(pod, self.hot.top(ep.pool, config.top_prefixes, now), now)

    def _warm(self, pod: PodWarmup, prefixes: list[HotPrefix], now: float) -> None:
        """Hand out the pod's warm requests (none: it ramps at once)."""
        if not prefixes:
            self.metrics.child(self.metrics.warmups, pod.pool, "nothing_hot").inc()
            self._start_ramp(pod, now)
            return
        pod.requests = pod.pending = len(prefixes)
        self._ready.extend(
            WarmRequest(pod.endpoint_id, pod.pool, prefix, pod.joined_at) for prefix in prefixes
        )
        self._set_phase(pod, "warming")

    def left(self, ep: Endpoint) -> None:
        self._finished.pop(ep.id, None)
        pod = self._pods.pop(ep.id, None)
        if pod is not None:
            self._ready = [r for r in self._ready if r.endpoint_id != ep.id]
            self._claims = [p for p in self._claims if p is not pod]
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

    # -- shared warm-ups (the I/O side talks to the directory) -----------------------------

    def take_claims(self, now: float) -> list[WarmClaim]:
        """Pods that joined, to claim (each once); answer each with `claim_result`."""
        claims, self._claims = self._claims, []
        return [
            pod.claim(can_warm=self.hot.has(pod.pool))
            for pod in claims
            if self._pods.get(pod.endpoint_id) is pod and pod.phase == "warming"
        ]

    def claim_result(
        self,
        claim: WarmClaim,
        outcome: ClaimOutcome | Literal["failed"],
        now: float,
        *,
        warmed_by: str = "",
    ) -> None:
        """What the directory answered to `claim` (see the module docstring)."""
        pod = self._current(claim, "claiming")
        if pod is None:
            return
        top = self.config.top_prefixes
        if outcome == "claimed":
            pod.role = "claimed"
            peers = self.peer_counts.counts(pod.pool, now)
            self._warm(pod, self.hot.top(pod.pool, top, now, peer_counts=peers), now)
        elif outcome in ("follow", "done"):
            pod.role, pod.warmed_by = "following", warmed_by
            if outcome == "done":
                self._followed(pod, now)
        elif outcome == "nothing":
            pod.role = "own"
            self._warm(pod, [], now)
        else:  # the directory failed: warm it from this replica's own history
            pod.role = "own"
            self._warm(pod, self.hot.top(pod.pool, top, now), now)

    def following(self, now: float) -> list[WarmClaim]:
        """Pods another replica is warming and this one still holds back: read their claims
        and answer with `follow_result`."""
        out = []
        for pod in list(self._pods.values()):
            if pod.role == "following" and pod.phase == "warming":
                self._advance(pod, now)  # its own deadline bounds the wait
                if pod.phase == "warming":
                    out.append(pod.claim())
        return out

    def follow_result(
        self, claim: WarmClaim, state: ClaimState | Literal["failed"], now: float
    ) -> None:
        """A followed claim's state: done, or gone (its replica stopped; the pod was
        replaced): ramp; failed (the directory): warm it from this replica's own history."""
        pod = self._current(claim, "following")
        if pod is None or state == "warming":
            return
        if state == "failed":
            pod.role = "own"
            self._warm(pod, self.hot.top(pod.pool, self.config.top_prefixes, now), now)
        else:
            self._followed(pod, now)

    def sharing(self, now: float) -> bool:
        """Whether a shared warm-up is under way here (claims to make or answer, pods followed
        or warmed for the others, done marks to write): the I/O side then polls often."""
        busy = False
        for pod in list(self._pods.values()):
            if pod.role != "own" and pod.phase == "warming":
                self._advance(pod, now)  # a claimed warm-up that timed out is reported
                busy = True
        return busy or bool(self._claims or self._reports)

    def take_reports(self) -> list[WarmClaim]:
        """Warm-ups this replica claimed that ended since: mark each done for the others."""
        reports, self._reports = self._reports, []
        return [
            pod.claim()
            for pod in reports  # not a pod that left since
            if self._pods.get(pod.endpoint_id) is pod or self._finished.get(pod.endpoint_id) is pod
        ]

    def _current(self, claim: WarmClaim, role: Role) -> PodWarmup | None:
        """The warming pod `claim` was made for, in `role` (None: it left, came back since,
        timed out or moved on)."""
        pod = self._pods.get(claim.endpoint_id)
        if pod is None or pod.joined_at != claim.joined_at:
            return None
        return pod if pod.role == role and pod.phase == "warming" else None

    def _followed(self, pod: PodWarmup, now: float) -> None:
        self.metrics.child(self.metrics.warmups, pod.pool, "followed").inc()
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
        if pod.role == "claimed":  # the other replicas follow this warm-up
            self._reports.append(pod)
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
