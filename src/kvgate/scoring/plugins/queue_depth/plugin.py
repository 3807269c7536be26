"""``queue-depth`` scorer (balance): fewer requests on the pod is better.

score = (min_load + 1) / (load + 1) over the candidates, where load = max(router in-flight,
engine running + waiting). The least-loaded candidates score 1; equal loads score equal.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import NoParams


class QueueDepthParams(NoParams):
    """No parameters."""


class QueueDepthScorer:
    name = "queue-depth"

    def __init__(self, params: QueueDepthParams | None = None) -> None:
        self.params = params or QueueDepthParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        est = state.estimates
        loads = [max(0, est[e.id].load) for e in candidates]
        if not loads:
            return []
        best = min(loads) + 1
        return [best / (load + 1) for load in loads]
