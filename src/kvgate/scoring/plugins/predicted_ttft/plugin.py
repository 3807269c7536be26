"""``predicted-ttft`` scorer (hybrid): the cost model's predicted time to first token.

cost = ttft + work_weight x prefill_seconds; score = (min_cost + floor) / (cost + floor) over the
candidates: the cheapest candidate scores 1, one twice as costly about 0.5. The floor keeps
differences of a few milliseconds (noise) from looking like factors when every prediction is
near zero. It rewards cache hits (less to prefill) and short queues at once, on one scale:
seconds. ``work_weight`` > 0 also charges for the prefill work itself, which delays whoever
queues behind it on that pod: pure per-request TTFT (0) moves sessions off their holders too
eagerly under load. ``pending_weight`` > 0 charges for the first tokens the prefill delays:
with chunked prefill, a request still waiting for its first token on the pod shares a step with
the first chunk of this prefill, and that step lasts as long as the chunk takes. It is charged
only on the candidates that hold the least of the prompt: it decides where a prefill that has to
be computed anyway goes, and never pushes a request off a pod holding more of its prompt (a
holder computes only the short rest; priced there too, agent sessions left their pods).
``decode_weight`` > 0 adds the cost model's ``decode_seconds``: how much longer the answer's
decode takes on the pod because of the KV cache its requests hold. It is not charged while
every candidate has a prefill queue (longer than ``floor_seconds``): then the pool is saturated,
its steps are bound by prefill compute rather than by reading the KV cache, and a cache hit
(capacity) is worth more than a lighter decode (charged there too, the Mooncake trace at 130%
lost a third of its hits and 13% of its mean TTFT; docs/scoring.md, *Decode*).
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
    pending_weight: float = Field(default=0.0, ge=0)
    """Weight of the first-token delay the prefill causes: the requests this router sent to the
    pod that have no first token yet x the time of this prefill's first chunk (at most
    ``chunk_tokens`` of its uncached tokens), on the candidates holding the least of the prompt;
    0 = ignored."""
    decode_weight: float = Field(default=0.0, ge=0)
    """Weight of the predicted decode slowdown on the pod (``CostEstimate.decode_seconds``),
    charged while some candidate has no prefill queue; 0 = ignored."""
    decode_min_output_ratio: float = Field(default=0.0, ge=0)
    """The router asks for the decode price only in pools whose answers average at least this
    many output tokens per prompt token; 0 = in every pool. Read by the router, not here:
    elsewhere it passes no expected output, so ``decode_seconds`` is 0."""
    chunk_tokens: int = Field(default=8192, ge=1)
    """Prompt tokens an engine step prefills at most (vLLM ``--max-num-batched-tokens``)."""


class PredictedTtftScorer:
    name = "predicted-ttft"

    def __init__(self, params: PredictedTtftParams | None = None) -> None:
        self.params = params or PredictedTtftParams()
        # the policy asks for the answer's expected output where this scorer prices it
        self.decode_min_output_ratio = (
            self.params.decode_min_output_ratio if self.params.decode_weight > 0 else None
        )

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        est = state.estimates
        p = self.params
        w, a, q, chunk = p.work_weight, p.interference_weight, p.pending_weight, p.chunk_tokens
        d = p.decode_weight
        if d and min((est[e.id].queue_seconds for e in candidates), default=0.0) > p.floor_seconds:
            d = 0.0  # every pod has a prefill queue: saturated, compute bound
        # the first-token price applies where the prefill is longest: to the candidates that
        # hold the least of the prompt
        coldest = max((est[e.id].uncached_tokens for e in candidates), default=0) if q else 0
        costs = []
        for e in candidates:
            x = est[e.id]
            cost = x.ttft_seconds + (w + a * x.load) * x.prefill_seconds + d * x.decode_seconds
            if q and e.pending_prefill_requests > 0 and x.uncached_tokens >= coldest:
                first_chunk = min(x.uncached_tokens, chunk) / x.prefill_tokens_per_second
                cost += q * e.pending_prefill_requests * first_chunk
            costs.append(cost if cost > 0.0 else 0.0)
        if not costs:
            return []
        floor = self.params.floor_seconds
        best = min(costs) + floor
        return [best / (c + floor) for c in costs]
