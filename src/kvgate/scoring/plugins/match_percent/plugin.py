"""``match-percent`` scorer (affinity): the whole percent of the prompt the pod holds.

A re-implementation of the match AIBrix's prefix-cache router ranks pods by (vllm-project/aibrix,
``pkg/plugins/gateway/algorithms/prefix_cache.go`` and its prefix hash table, 2026): an integer
percentage of the prompt's tokens found on the pod. score = floor(100 x hit_tokens /
prompt_tokens) / 100, so pods within the same percent tie and a load tie-break decides (AIBrix
sorts by match percent, then by request count). ``hit_tokens`` is the cost model's prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import NoParams


class MatchPercentParams(NoParams):
    """No parameters."""


class MatchPercentScorer:
    name = "match-percent"

    def __init__(self, params: MatchPercentParams | None = None) -> None:
        self.params = params or MatchPercentParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        total = state.request.prompt_tokens
        if total <= 0:
            return [0.0] * len(candidates)
        est = state.estimates
        return [min(100, est[e.id].hit_tokens * 100 // total) / 100 for e in candidates]
