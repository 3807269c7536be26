"""``load-stddev`` guard: no pod above the mean load plus k standard deviations.

A re-implementation of AIBrix's prefix-match load check (vllm-project/aibrix,
``pkg/plugins/gateway/algorithms/prefix_cache.go``, ``getTargetPodFromMatchedPods``, 2026):
a pod holding the prefix is chosen only if its request count is at most
``mean + std_dev_factor x stddev`` over the candidates (sample standard deviation, as AIBrix
computes it; ``load`` as in ``load-imbalance``).

AIBrix applies the check to the pods that hold the prefix and otherwise falls back to the least
loaded pod. Applying it to every candidate is equivalent, because the least loaded pod is never
above the mean, so it never empties its input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_LOAD_BOUND, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class LoadStddevParams(StrictParams):
    std_dev_factor: float = Field(default=1.0, ge=0)
    """AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR: k in mean + k x stddev."""


class LoadStddevFilter:
    name = "load-stddev"
    reason: str | None = REASON_LOAD_BOUND

    def __init__(self, params: LoadStddevParams | None = None) -> None:
        self.params = params or LoadStddevParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        n = len(candidates)
        if n < 2:
            return candidates
        est = state.estimates
        loads = [max(0, est[e.id].load) for e in candidates]
        mean = sum(loads) / n
        stddev = math.sqrt(sum((x - mean) ** 2 for x in loads) / (n - 1))
        bound = mean + self.params.std_dev_factor * stddev + 1e-9
        kept = [e for e, load in zip(candidates, loads, strict=True) if load <= bound]
        return kept or candidates
