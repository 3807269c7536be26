"""``predicted-ttft`` scorer (hybrid): the cost model's predicted time to first token.

cost = ttft + work_weight x prefill_seconds; score = (min_cost + floor) / (cost + floor) over the
candidates: the cheapest candidate scores 1, one twice as costly about 0.5. The floor keeps
differences of a few milliseconds (noise) from looking like factors when every prediction is
near zero. It rewards cache hits (less to prefill) and short queues at once, on one scale:
seconds. ``work_weight`` > 0 also charges for the prefill work itself, which delays whoever
queues behind it on that pod: pure per-request TTFT (0) moves sessions off their holders too
eagerly under load.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class PredictedTtftParams(StrictParams):
    floor_seconds: float = Field(default=0.02, gt=0)
    work_weight: float = Field(default=0.0, ge=0)
    """Extra weight on the prefill work itself (see the module docstring); 0 = pure TTFT."""
    interference_weight: float = Field(default=0.0, ge=0)
    """Weight of the decode stall the prefill causes: prefill seconds x requests already on the
    pod (they decode in the same steps while it runs); 0 = ignored."""


class PredictedTtftScorer:
    name = "predicted-ttft"

    def __init__(self, params: PredictedTtftParams | None = None) -> None:
        self.params = params or PredictedTtftParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        est = state.estimates
        w = self.params.work_weight
        a = self.params.interference_weight
        costs = []
        for e in candidates:
            x = est[e.id]
            cost = x.ttft_seconds + (w + a * x.load) * x.prefill_seconds
            costs.append(cost if cost > 0.0 else 0.0)
        if not costs:
            return []
        floor = self.params.floor_seconds
        best = min(costs) + floor
        return [best / (c + floor) for c in costs]
