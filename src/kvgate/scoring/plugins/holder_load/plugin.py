"""``holder-load`` guard: a pod holding the request's prefix that runs far more requests than
the least-loaded candidate takes no more of them, so a hot prefix is copied to another pod.

Stickiness (``prefix-cache-affinity``) keeps a request on the pods holding its prefix until
their queued *prefill* tokens run ahead; the predicted-TTFT scorer prices queued prefill too. A
hot prefix with short suffixes queues almost no prefill on its holder, whatever the traffic,
so both keep sending it there while its decode batch grows: every step of that pod reads every
running sequence's context, each of its requests decodes slower, and its end-to-end time grows
several-fold while the other pods idle. This guard is the missing load signal: holders (pods
holding at least ``affinity_threshold`` of the request's blocks) whose load is both more than
``max_gap_requests`` above and more than ``max_ratio`` times the least-loaded candidate's are
dropped, as long as a candidate is left. The request then goes to another holder, or recomputes
the prefix on a pod that then holds it too, until the loads are within the bounds again.

Load is max(router in-flight, engine running + waiting), as in ``load-bound``. Unlike that
guard, pods without the prefix are never dropped and both bounds must be exceeded, so loads
that differ by a few requests (the usual spread of sessions and prefix groups) keep their hits.
For an online request the least-loaded pod is sought among the pods that host no batch
request: online traffic gathered on a few pods while batch work borrows the others is what
``class-isolation`` wants, not a pile to spread onto the batch pods.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_LOAD_BOUND, CycleState, EndpointSnapshot
from kvgate.scoring.block_counts import split_holders
from kvgate.scoring.params import StrictParams


class HolderLoadParams(StrictParams):
    affinity_threshold: float = Field(default=0.8, gt=0, le=1)
    """Share of the request's blocks that makes a pod a holder (as ``prefix-cache-affinity``)."""
    max_gap_requests: int = Field(default=32, ge=0)
    """A holder more than this many requests above the least-loaded candidate..."""
    max_ratio: float = Field(default=1.5, ge=1.0)
    """...and above this multiple of its load takes no more of the prefix's requests."""


class HolderLoadFilter:
    name = "holder-load"
    reason: str | None = REASON_LOAD_BOUND

    def __init__(self, params: HolderLoadParams | None = None) -> None:
        self.params = params or HolderLoadParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        if len(candidates) < 2:
            return candidates
        p = self.params
        est = state.estimates
        targets = candidates
        if state.request.request_class == "online":
            targets = [e for e in candidates if e.batch_in_flight == 0]
            if not targets:
                return candidates
        least = min(est[e.id].load for e in targets)
        bound = max(least + p.max_gap_requests, p.max_ratio * least)
        if all(est[e.id].load <= bound for e in candidates):  # the usual case
            return candidates
        holders, _others = split_holders(state, candidates, p.affinity_threshold)
        overloaded = {e.id for e in holders if est[e.id].load > bound}
        if not overloaded:
            return candidates
        return [e for e in candidates if e.id not in overloaded]
