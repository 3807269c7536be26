"""``class-isolation`` filter: online requests leave the pods that batch work borrowed.

Batch requests borrow an online pod only while it has room (the router's borrowing limits).
An online request that then lands there waits behind the batch prompt's prefill and decodes
beside its long answer; and every online request a borrowed pod keeps taking uses room the
batch work could have had, so with online traffic spread over every pod, no pod stays
borrowable and batch waits in the router's queue. Keeping the classes apart where that is free
lets the online traffic gather on as few pods as it needs and the batch work take the rest.

Algorithm, for an online request: the candidates that host the fewest batch requests
(``batch_in_flight``: this router's, plus the other replicas' where they share load; usually
none) are kept, unless none of them is within ``max_extra_seconds`` of the best predicted TTFT
among all candidates (then every candidate is kept). Batch requests, and decisions where every
candidate hosts as many batch requests, keep every candidate.

While batch requests with no batch pool of their own wait in this router's queue for a pod
they may borrow (``RoutingRequest.batch_waiting``), the lightest of those pods with the fewest batch requests
(fewest requests, ties by id) is yielded to them: it is dropped too, if it runs any request and
another of them is within ``max_extra_seconds`` of the best. It drains, becomes borrowable under
the borrowing limits, and the waiting batch work takes it. Without this the online traffic
stays wherever its prefix groups started: two pods each half full of online requests, neither
borrowable, while a batch queue grows (a pod that runs nothing is already free, and is kept).
Batch requests that have a batch pool wait for it: the online traffic makes no room for them.
Only a request that finds at least half its prompt cached on one of those pods yields: traffic
that gathers with its hits adds little prefill where it gathers, while cold prompts packed onto
fewer pods stall the decodes there with their prefills (mixed with cold online prompts at 130%:
online end-to-end 3.0 s spread, 7.7 s packed; docs/scoring.md).

Two choices, both measured on the mixed workload at 130% load (docs/scoring.md, *Online and
batch once blocks in flight count*):

- *Fewest*, not *none*: at start-up batch borrows every pod, and an online prefix group then
  stays wherever its first request went (its later requests hit there), so the online traffic
  stayed spread over the borrowed pods and took the room batch needed. Preferring the pods with
  the least batch work gathers it from the first requests on.
- ``max_extra_seconds`` 0.25 s: the price of leaving a borrowed pod is usually recomputing the
  request's prefix once on the pod it moves to; its group's later requests then hit there. At
  0.05 s (less than one 1k-token prefill) a group that started on a borrowed pod never left.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_CLASS_ISOLATION, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams

#: The yield applies to a request that finds at least this share of its prompt cached on one of
#: the pods with the fewest batch requests.
MIN_CACHED_SHARE = 0.5


class ClassIsolationParams(StrictParams):
    max_extra_seconds: float = Field(default=0.25, ge=0)
    """How much later (predicted TTFT) a pod with the fewest batch requests may answer than the
    best pod and still be preferred to it."""
    yield_to_batch: bool = True
    """While batch requests wait to borrow, leave the lightest online pod to them (see the
    module docstring); false keeps the online traffic's decodes in smaller batches and lets
    batch wait."""


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
        fewest = min(e.batch_in_flight for e in candidates)
        free = [e for e in candidates if e.batch_in_flight == fewest]
        yielding = self.params.yield_to_batch and state.request.batch_waiting > 0 and len(free) > 1
        if len(free) == len(candidates) and not yielding:
            return candidates
        est = state.estimates
        best = min(est[e.id].ttft_seconds for e in candidates)
        limit = best + self.params.max_extra_seconds
        kept = [e for e in free if est[e.id].ttft_seconds <= limit]
        # Only traffic that gathers with its hits: cold prompts packed onto fewer pods would stall
        # their decodes with prefills.
        if yielding and max(est[e.id].hit_tokens for e in free) >= (
            MIN_CACHED_SHARE * state.request.prompt_tokens
        ):
            lightest = min(free, key=lambda e: (est[e.id].load, e.id))
            others = [e for e in kept if e is not lightest]
            if est[lightest.id].load > 0 and others:
                return others
        if len(free) == len(candidates):
            return candidates
        return kept or candidates
