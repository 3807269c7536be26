"""``affinity-cap`` guard: never wait longer than ``max_affinity_wait_seconds`` in a pod's queue
while a pod within that wait would give the request its first token sooner.

The cost model's work term (``work_weight``) keeps a session on the pod holding its long history
for as long as queueing there costs the fleet less than recomputing the history elsewhere; that
can mean seconds of queueing for the session. The cap bounds that wait: a candidate whose
predicted queue delay exceeds it is dropped when a candidate within the cap has a lower
predicted time to first token. A holder over the cap whose TTFT is still the best stays:
moving the request off it would make this request slower *and* recompute its prefix. When no
candidate is within the cap, all are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_AFFINITY_CAP, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class AffinityCapParams(StrictParams):
    max_affinity_wait_seconds: float = Field(default=5.0, ge=0)
    """Predicted queue delay above which a pod is not chosen while a pod within it is faster."""


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
        within = [est[e.id].ttft_seconds for e in candidates if est[e.id].queue_seconds <= cap]
        if not within or len(within) == len(candidates):
            return candidates
        fastest_within = min(within)
        return [
            e
            for e in candidates
            if est[e.id].queue_seconds <= cap or est[e.id].ttft_seconds <= fastest_within
        ]
