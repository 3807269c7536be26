"""``affinity-cap`` guard: never wait longer than ``max_affinity_wait_seconds`` in a pod's queue
while another candidate's predicted queue wait is within the cap.

The cost model alone would keep sending a session to the pod holding its long history for as
long as queueing there beats recomputing elsewhere; that can mean seconds of queueing for
everyone on that pod. The cap is a hard limit on that wait: candidates whose predicted queue
delay exceeds it are dropped when at least one candidate is under it (otherwise all are kept).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_AFFINITY_CAP, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class AffinityCapParams(StrictParams):
    max_affinity_wait_seconds: float = Field(default=5.0, ge=0)
    """Predicted queue delay above which a pod is not chosen while another pod is within it."""


class AffinityCapFilter:
    name = "affinity-cap"
    reason: str | None = REASON_AFFINITY_CAP

    def __init__(self, params: AffinityCapParams | None = None) -> None:
        self.params = params or AffinityCapParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        cap = self.params.max_affinity_wait_seconds
        est = state.estimates
        kept = [e for e in candidates if est[e.id].queue_seconds <= cap]
        return kept or candidates
