"""``kv-block-cost`` scorer (hybrid): NVIDIA Dynamo's KV router cost, lowest is best.

A re-implementation of Dynamo's ``DefaultWorkerSelector`` cost (ai-dynamo/dynamo,
``lib/llm/src/kv_router/`` scheduler/selector and ``ActiveSequences``; docs
``docs/router/kv_cache_routing.md``, read 2026). For worker *w*, in blocks of ``bs`` tokens:

    prefill_blocks(w) = (tokens of w's requests still prefilling + prompt - overlap(w) x bs) / bs
    decode_blocks(w)  = active blocks on w + blocks of this request w does not hold
    cost(w)           = overlap_score_weight x prefill_blocks(w) + decode_blocks(w)

Dynamo tracks active blocks itself (the blocks of every request it routed and that has not
finished). kvgate's snapshot does not, so active blocks are approximated as

    kv_cache_usage x total_kv_blocks        (blocks held by the engine's running requests)
    + pending_prefill_tokens / bs           (requests sent and not yet prefilled hold none yet)

with ``total_kv_blocks`` the engines' ``num_gpu_blocks`` (a parameter; a pod with no fresh
engine report counts only the pending blocks). "Blocks this request does not hold" counts the
request's blocks beyond the directory's match, i.e. it assumes the matched prefix is in use on
the pod (true for a hot shared prefix, an undercount for an idle session's history). Like Dynamo,
the overlap is the plain leading-block match (no last-token rule).

Scores are the costs min-max scaled to [0, 1] over the candidates (1 = cheapest; 1 for all when
equal), so the ``softmax`` picker samples exactly as Dynamo samples its normalised logits.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.block_counts import held_blocks, request_blocks
from kvgate.scoring.params import StrictParams


class KvBlockCostParams(StrictParams):
    overlap_score_weight: float = Field(default=1.0, ge=0)
    """Weight of the prefill blocks (Dynamo ``--kv-overlap-score-weight``); 0 = load only."""
    total_kv_blocks: int = Field(default=24_626, ge=1)
    """The engines' ``num_gpu_blocks``, to turn ``kv_cache_usage`` into active blocks. Default:
    the simulator's H100 / Llama-3-8B pod at ``--gpu-memory-utilization 0.9``."""


class KvBlockCostScorer:
    name = "kv-block-cost"

    def __init__(self, params: KvBlockCostParams | None = None) -> None:
        self.params = params or KvBlockCostParams()

    def cost_blocks(self, state: CycleState, endpoint: EndpointSnapshot) -> float:
        """Dynamo's cost of sending the request to ``endpoint``, in blocks."""
        req = state.request
        bs = float(req.block_tokens if req.block_tokens > 0 else 1)
        total = request_blocks(req)
        overlap = held_blocks(state.matched_blocks, endpoint.id, total)
        prompt = max(0, req.prompt_tokens)
        new_tokens = max(0.0, prompt - overlap * bs)
        pending = max(0, endpoint.pending_prefill_tokens)
        prefill_blocks = (pending + new_tokens) / bs
        active = pending / bs
        eng = endpoint.engine
        if eng is not None:
            usage = min(1.0, max(0.0, eng.kv_cache_usage))
            active += usage * self.params.total_kv_blocks
        request_total = -(-prompt // int(bs))  # ceil: Dynamo counts the partial last block
        decode_blocks = active + max(0, request_total - overlap)
        return self.params.overlap_score_weight * prefill_blocks + decode_blocks

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        costs = [self.cost_blocks(state, e) for e in candidates]
        if not costs:
            return []
        low, high = min(costs), max(costs)
        if high == low:
            return [1.0] * len(costs)
        return [(high - c) / (high - low) for c in costs]
