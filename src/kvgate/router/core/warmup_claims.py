"""Warm-ups shared between router replicas: a joining pod is warmed once, for all of them.

With **shared** warm-ups (replicas on the Redis directory, `warmup.shared`), `warmup.py` hands
each joining pod here (`joined`): it is held back (warming) while its claim is decided. The I/O
side (`http/warm_sharing.py`, or the discrete-event bench in process) talks to the directory
(`kvgate.directory.shared_warmup`) and reports back; this module only keeps the states:

    claiming ──claimed──> warmed here, for all (its end is reported: `take_reports`)
             ├─follow───> following ──(claim done or gone)──> ramps as if warmed here
             ├─done─────> ramps (warmed already: this replica heard of the pod late)
             ├─nothing──> ramps (no replica claimed it and this one has nothing hot)
             └─failed───> warmed from this replica's own history (as without sharing)

- `take()`: pods that joined, to claim (each once); answer each with `claim_result`.
  **claimed**: this replica warms it, with the prefixes it knows ranked by every replica's
  request counts (`peer_prefixes.py`); when that warm-up ends (answered, or timed out) the pod
  is in `take_reports()`, to be marked done; a mark that failed goes back with
  `requeue_report` and is tried again while the claim lives. **follow**: another replica warms
  it; the pod stays out of rotation until a read of the claims `following()` lists
  (`follow_result`) finds it done (or gone), or this replica's own `timeout_seconds` passes.
- **failed** (Redis down or slow, at the claim or while following): the pod is warmed from this
  replica's own history, exactly as without sharing, within the same deadline; `fail_pending`
  does that for every undecided pod when the directory cannot be asked at all.
- `advance(now)` moves the shared warm-ups on by the clock (a pod past its deadline ramps; a
  claimed one is then reported); `in_progress()` (no side effect) says whether the I/O side
  should poll often.

Plain synchronous code on the core's clock, like the rest of the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvgate.directory.shared_warmup import ClaimOutcome, ClaimState
from kvgate.router.core.hot_prefixes import HotPrefixes
from kvgate.router.core.peer_prefixes import PeerPrefixCounts
from kvgate.router.core.warmup_pods import PodWarmup, Role, WarmPods

#: a finished claim stays readable this long, for replicas that hear of the pod late
DONE_GRACE_SECONDS = 10.0
#: how often a replica reads the claims it follows
FOLLOW_POLL_SECONDS = 0.1


@dataclass(slots=True, frozen=True)
class WarmClaim:
    """A joining pod's warm-up as replicas share it (`kvgate.directory.shared_warmup`)."""

    endpoint_id: str
    pool: str
    generation: str  # the pod's (a replaced pod is another warm-up)
    joined_at: float  # this replica's join (matches the answer to the warm-up it was for)
    can_warm: bool = False  # this replica has prefixes to warm it with


def _claim(pod: PodWarmup, *, can_warm: bool = False) -> WarmClaim:
    return WarmClaim(pod.endpoint_id, pod.pool, pod.generation, pod.joined_at, can_warm)


class WarmClaims:
    """The shared warm-ups' states (see the module docstring). Owned by `Warmup`."""

    def __init__(self, pods: WarmPods, hot: HotPrefixes, peer_counts: PeerPrefixCounts) -> None:
        self._pods = pods
        self._hot = hot
        self._peer_counts = peer_counts
        self._to_claim: list[PodWarmup] = []

    def joined(self, pod: PodWarmup) -> None:
        """Hold `pod` back (warming) until its claim is decided."""
        pod.role = "claiming"
        self._to_claim.append(pod)
        self._pods.set_phase(pod, "warming")

    def left(self, pod: PodWarmup) -> None:
        self._to_claim = [p for p in self._to_claim if p is not pod]

    def take(self) -> list[WarmClaim]:
        """Pods that joined, to claim (each once); answer each with `claim_result`."""
        pods, self._to_claim = self._to_claim, []
        return [
            _claim(pod, can_warm=self._hot.has(pod.pool))
            for pod in pods
            if self._pods.active.get(pod.endpoint_id) is pod and pod.phase == "warming"
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
        if outcome == "claimed":
            pod.role = "claimed"
            self._warm(pod, now, pooled=True)
        elif outcome in ("follow", "done"):
            pod.role, pod.warmed_by = "following", warmed_by
            if outcome == "done":
                self._followed(pod, now)
        elif outcome == "nothing":
            pod.role = "own"
            self._pods.warm(pod, [], now)
        else:  # the directory failed: warm it from this replica's own history
            pod.role = "own"
            self._warm(pod, now, pooled=False)

    def following(self) -> list[WarmClaim]:
        """Pods another replica is warming and this one still holds back: read their claims
        and answer with `follow_result` (`advance` first: a pod past its deadline ramps)."""
        return [
            _claim(pod)
            for pod in self._pods.active.values()
            if pod.role == "following" and pod.phase == "warming"
        ]

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
            self._warm(pod, now, pooled=False)
        else:
            self._followed(pod, now)

    def take_reports(self) -> list[WarmClaim]:
        """Warm-ups this replica claimed that ended since: mark each done for the others."""
        pods = list(self._pods.claimed_ended)
        self._pods.claimed_ended.clear()
        return [_claim(pod) for pod in pods if self._pods.known(pod.endpoint_id) is pod]

    def requeue_report(self, claim: WarmClaim, now: float) -> None:
        """Marking `claim` done failed (Redis): report it again, while that still matters: the
        pod is still here from the same join, and its claim has not expired (it lives
        `timeout_seconds` from the join; the followers wait no longer either)."""
        pod = self._pods.known(claim.endpoint_id)
        if (
            pod is not None
            and pod.joined_at == claim.joined_at
            and pod.role == "claimed"
            and now < pod.deadline
            and pod not in self._pods.claimed_ended
        ):
            self._pods.claimed_ended.append(pod)

    def advance(self, now: float) -> None:
        """Move every shared warm-up on by the clock: a pod claimed, followed or still being
        claimed that reached its deadline ramps (a claimed one is then reported)."""
        for pod in list(self._pods.active.values()):
            if pod.role != "own" and pod.phase == "warming":
                self._pods.advance(pod, now)

    def in_progress(self) -> bool:
        """Whether a shared warm-up is under way here (claims to make or answer, pods followed
        or warmed for the others, done marks to write): the I/O side then polls often."""
        return bool(self._to_claim or self._pods.claimed_ended) or any(
            pod.role != "own" and pod.phase == "warming" for pod in self._pods.active.values()
        )

    def fail_pending(self, now: float) -> bool:
        """The directory cannot be asked (sharing turned off, or a round failed): every pod
        whose claim is undecided, and every pod followed, is warmed from this replica's own
        history, as without sharing. True if any was (the I/O side then sends)."""
        self._to_claim = []
        failed = False
        for pod in list(self._pods.active.values()):
            if pod.phase != "warming" or pod.role not in ("claiming", "following"):
                continue
            pod.role = "own"
            self._warm(pod, now, pooled=False)
            failed = True
        return failed

    def _warm(self, pod: PodWarmup, now: float, *, pooled: bool) -> None:
        """Warm `pod` with its pool's top prefixes, ranked by every replica's counts if
        `pooled` (this replica claimed it), else by this replica's own."""
        pool, top = pod.pool, self._pods.config.top_prefixes
        peers = self._peer_counts.counts(pool, now) if pooled else None
        self._pods.warm(pod, self._hot.top(pool, top, now, peer_counts=peers), now)

    def _current(self, claim: WarmClaim, role: Role) -> PodWarmup | None:
        """The warming pod `claim` was made for, in `role` (None: it left, came back since,
        timed out or moved on)."""
        pod = self._pods.active.get(claim.endpoint_id)
        if pod is None or pod.joined_at != claim.joined_at:
            return None
        return pod if pod.role == role and pod.phase == "warming" else None

    def _followed(self, pod: PodWarmup, now: float) -> None:
        self._pods.metrics.child(self._pods.metrics.warmups, pod.pool, "followed").inc()
        self._pods.start_ramp(pod, now)
