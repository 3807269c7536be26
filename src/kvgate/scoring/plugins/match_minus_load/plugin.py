"""``match-minus-load`` scorer (hybrid): prefix match minus beta x relative load.

A re-implementation of vLLM production-stack's ``loadaware`` routing logic
(vllm-project/production-stack, ``src/vllm_router/routers/routing_logic.py``, pull request
#1035, 2026):

    raw(i)           = matched_tokens(i) / prompt_tokens - beta x relative_load(i)
    relative_load(i) = (load(i) - mean_load) / max(1, mean_load)

and the request goes to the argmax. ``matched_tokens`` is the cost model's ``hit_tokens`` (the
directory's match, vLLM's last-token rule); ``load`` is the candidate's request count (max of this
router's in-flight and the engine's running + waiting, i.e. the router's in-flight requests when
it is the only client, as production-stack counts them); the mean is over the candidates.

Both terms are dimensionless: with beta 1, a pod at twice the mean load loses one full cache
hit's worth of preference. The raw values are min-max scaled to [0, 1] over the candidates
(1 = best; 1 for all when equal), which keeps the argmax and its ties.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class MatchMinusLoadParams(StrictParams):
    beta: float = Field(default=1.0, ge=0)
    """Exchange rate between cache locality and relative load (production-stack ``beta``)."""


class MatchMinusLoadScorer:
    name = "match-minus-load"

    def __init__(self, params: MatchMinusLoadParams | None = None) -> None:
        self.params = params or MatchMinusLoadParams()

    def raw_scores(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        """production-stack's score of each candidate, before scaling."""
        if not candidates:
            return []
        est = state.estimates
        prompt = state.request.prompt_tokens
        loads = [max(0, est[e.id].load) for e in candidates]
        mean = sum(loads) / len(loads)
        scale = max(1.0, mean)
        beta = self.params.beta
        out = []
        for e, load in zip(candidates, loads, strict=True):
            match = est[e.id].hit_tokens / prompt if prompt > 0 else 0.0
            out.append(match - beta * (load - mean) / scale)
        return out

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        raw = self.raw_scores(state, candidates)
        if not raw:
            return []
        low, high = min(raw), max(raw)
        if high == low:
            return [1.0] * len(raw)
        return [(r - low) / (high - low) for r in raw]
