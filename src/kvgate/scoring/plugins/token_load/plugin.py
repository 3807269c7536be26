"""``token-load`` scorer (balance): fewer queued prefill tokens is better.

A re-implementation of llm-d's ``token-load-scorer`` (llm-d/llm-d-router,
``pkg/epp/framework/plugins/scheduling/scorer/tokenload/``, read 2026):

    tokens = in-flight prefill tokens on the pod + this request's tokens the pod does not hold
    score  = 1 - min(1, tokens / queue_threshold_tokens)

In-flight prefill tokens are the snapshot's ``pending_prefill_tokens`` (llm-d's ``InFlightLoad``:
uncached prompt tokens of requests sent and not yet streaming); this request's share is the cost
model's ``uncached_tokens`` on that pod (llm-d's ``CurrentRequestLoad``, also prefix-discounted).
The threshold only normalises: with a max-score picker the pod with the fewest tokens wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class TokenLoadParams(StrictParams):
    queue_threshold_tokens: int = Field(default=4_194_304, gt=0)
    """Tokens at which the score reaches 0 (llm-d ``queueThresholdTokens``: 128 requests x 32k)."""


class TokenLoadScorer:
    name = "token-load"

    def __init__(self, params: TokenLoadParams | None = None) -> None:
        self.params = params or TokenLoadParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        est = state.estimates
        limit = float(self.params.queue_threshold_tokens)
        out: list[float] = []
        for e in candidates:
            tokens = max(0, e.pending_prefill_tokens) + est[e.id].uncached_tokens
            out.append(1.0 - min(1.0, tokens / limit))
        return out
