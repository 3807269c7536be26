"""``predicted-ttft`` scorer (hybrid): the cost model's predicted time to first token.

score = (min_ttft + floor_seconds) / (ttft + floor_seconds) over the candidates: the fastest
candidate scores 1, one predicted twice as slow about 0.5. The floor keeps differences of a few
milliseconds (noise) from looking like factors when every prediction is near zero. It rewards
cache hits (less to prefill) and short queues at once, on one scale: seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot, ScorerCategory
from kvgate.scoring.params import StrictParams


class PredictedTtftParams(StrictParams):
    floor_seconds: float = Field(default=0.02, gt=0)


class PredictedTtftScorer:
    name = "predicted-ttft"
    category: ScorerCategory = "hybrid"

    def __init__(self, params: PredictedTtftParams | None = None) -> None:
        self.params = params or PredictedTtftParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        est = state.estimates
        costs = [max(0.0, est[e.id].ttft_seconds) for e in candidates]
        if not costs:
            return []
        floor = self.params.floor_seconds
        best = min(costs) + floor
        return [best / (c + floor) for c in costs]
