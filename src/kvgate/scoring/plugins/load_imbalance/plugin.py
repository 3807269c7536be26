"""``load-imbalance`` guard: under severe imbalance, only the least-loaded pods may take a request.

A re-implementation of AIBrix's prefix-cache load gate (vllm-project/aibrix,
``pkg/plugins/gateway/algorithms/prefix_cache.go``, ``getTargetPodListOnLoadImbalance``, 2026).
With ``load`` each candidate's request count (max of router in-flight and engine running +
waiting; AIBrix counts its gateway's in-flight requests):

    imbalanced = max(load) > factor x (mean(load) + 1)  and  max(load) - min(load) >= min_gap

When imbalanced, only the candidates at the minimum load are kept (reason ``load-bound`` when this
moves the request off its prefix holder); otherwise all are. It never empties its input.
An older AIBrix release used only the absolute gap (``max - min > 8``): ``factor`` 0 and
``min_gap`` 9 reproduce it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_LOAD_BOUND, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class LoadImbalanceParams(StrictParams):
    factor: float = Field(default=2.0, ge=0)
    """AIBRIX_PREFIX_CACHE_LOAD_IMBALANCE_FACTOR: the busiest pod must exceed factor x (mean+1)."""
    min_gap: int = Field(default=8, ge=0)
    """AIBRIX_PREFIX_CACHE_LOAD_IMBALANCE_MIN_GAP: and be at least this many requests above the
    least loaded one."""


class LoadImbalanceFilter:
    name = "load-imbalance"
    reason: str | None = REASON_LOAD_BOUND

    def __init__(self, params: LoadImbalanceParams | None = None) -> None:
        self.params = params or LoadImbalanceParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        if len(candidates) < 2:
            return candidates
        est = state.estimates
        loads = [max(0, est[e.id].load) for e in candidates]
        low, high = min(loads), max(loads)
        mean = sum(loads) / len(loads)
        if high <= self.params.factor * (mean + 1) or high - low < self.params.min_gap:
            return candidates
        return [e for e, load in zip(candidates, loads, strict=True) if load == low]
