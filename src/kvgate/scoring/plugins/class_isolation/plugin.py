"""``class-isolation`` filter: online requests leave the pods that batch work borrowed.

Batch requests borrow an online pod only while it has room (the router's borrowing limits).
An online request that then lands there waits behind the batch prompt's prefill and decodes
beside its long answer; and every online request a borrowed pod keeps taking uses room the
batch work could have had, so with online traffic spread over every pod, no pod stays
borrowable and batch waits in the router's queue. Keeping the classes apart where that is free
lets the online traffic gather on as few pods as it needs and the batch work take the rest.

Algorithm, for an online request: the candidates that host no batch request (``batch_in_flight
== 0``: this router's, plus the other replicas' where they share load) are kept, unless none of them is within ``max_extra_seconds`` of
the best predicted TTFT among all candidates (then every candidate is kept). Batch requests,
and decisions where every candidate or none hosts batch work, keep every candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_CLASS_ISOLATION, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class ClassIsolationParams(StrictParams):
    max_extra_seconds: float = Field(default=0.05, ge=0)
    """How much later (predicted TTFT) a pod without batch work may answer than the best pod
    and still be preferred to it."""


class ClassIsolationFilter:
    name = "class-isolation"
    reason: str | None = REASON_CLASS_ISOLATION

    def __init__(self, params: ClassIsolationParams | None = None) -> None:
        self.params = params or ClassIsolationParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        if state.request.request_class != "online" or len(candidates) <= 1:
            return candidates
        free = [e for e in candidates if e.batch_in_flight == 0]
        if not free or len(free) == len(candidates):
            return candidates
        est = state.estimates
        best = min(est[e.id].ttft_seconds for e in candidates)
        limit = best + self.params.max_extra_seconds
        kept = [e for e in free if est[e.id].ttft_seconds <= limit]
        return kept or candidates
