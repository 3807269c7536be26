"""``gie-prefix-cache`` scorer (affinity): the share of the request's first blocks the pod holds.

A re-implementation of the Gateway API Inference Extension's ``prefix-cache-scorer``
(kubernetes-sigs/gateway-api-inference-extension,
``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``, 2025; llm-d's default scorer
before "sticky until saturated"):

    total = min(request blocks, max_prefix_blocks_to_match)
    score = min(matched blocks, total) / total          (0 when total is 0)

Where it differs from kvgate's ``prefix-cache`` (``hit_tokens / prompt_tokens``): the prompt is
cut at ``max_prefix_blocks_to_match`` blocks, so every request sharing its first 256 blocks with
a pod scores 1 there however long the rest is; it counts blocks, not tokens, and ignores vLLM's
last-token rule. GIE hashes 64-character blocks ("16 tokens x 4 characters per token"); kvgate's
blocks are the engines' 16-token blocks, so 256 blocks cover the same ~4k tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.block_counts import held_blocks, request_blocks
from kvgate.scoring.params import StrictParams


class GiePrefixParams(StrictParams):
    max_prefix_blocks_to_match: int = Field(default=256, ge=1)
    """Blocks of the prompt that are matched at all (GIE ``maxPrefixBlocksToMatch``)."""


class GiePrefixScorer:
    name = "gie-prefix-cache"

    def __init__(self, params: GiePrefixParams | None = None) -> None:
        self.params = params or GiePrefixParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        total = min(request_blocks(state.request), self.params.max_prefix_blocks_to_match)
        if total <= 0:
            return [0.0] * len(candidates)
        matched = state.matched_blocks
        return [held_blocks(matched, e.id, total) / total for e in candidates]
