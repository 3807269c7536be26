"""``prefix-cache`` scorer (affinity): the share of the prompt the pod holds in its prefix cache.

score = hit_tokens / prompt_tokens (0 for an empty prompt), where hit_tokens is the cost model's
prediction from the directory's leading-block match (whole blocks, at most prompt - 1 tokens,
discounted for approximate keys). Longest consecutive match from block 0 wins, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import NoParams


class PrefixCacheParams(NoParams):
    """No parameters."""


class PrefixCacheScorer:
    name = "prefix-cache"

    def __init__(self, params: PrefixCacheParams | None = None) -> None:
        self.params = params or PrefixCacheParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        total = state.request.prompt_tokens
        if total <= 0:
            return [0.0] * len(candidates)
        est = state.estimates
        return [min(1.0, est[e.id].hit_tokens / total) for e in candidates]
