"""``load-bound`` guard: no endpoint above ``factor`` x the mean load (bounded-load hashing).

As in consistent hashing with bounded loads, the request counts itself: with *n* candidates and
total load *L* (each endpoint's load is max(router in-flight, engine running + waiting)), an
endpoint may take the request only if

    load + 1 <= max(factor * (L + 1) / n,  (L + 1) / n + slack_requests)

The additive ``slack_requests`` keeps the bound from forcing spreads at low load (1 vs 0
requests), where the cache win dominates; the cost model handles that range. If every candidate
is over the bound (impossible for factor >= 1, kept for safety) the input is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_LOAD_BOUND, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class LoadBoundParams(StrictParams):
    factor: float = Field(default=1.25, ge=1.0)
    """c in "no pod above c x mean"."""
    slack_requests: int = Field(default=4, ge=0)
    """Always allow this many requests above the mean."""


class LoadBoundFilter:
    name = "load-bound"
    reason: str | None = REASON_LOAD_BOUND

    def __init__(self, params: LoadBoundParams | None = None) -> None:
        self.params = params or LoadBoundParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        if len(candidates) < 2:
            return candidates
        est = state.estimates
        loads = [est[e.id].load for e in candidates]
        mean = (sum(loads) + 1) / len(candidates)
        bound = max(self.params.factor * mean, mean + self.params.slack_requests)
        kept = [e for e, load in zip(candidates, loads, strict=True) if load + 1 <= bound]
        return kept or candidates
