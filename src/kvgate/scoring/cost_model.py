"""Predicted time to first token (TTFT) of a request on each endpoint.

For endpoint *p* with prefill rate *r_p* (tokens/s):

    hit_p      = min(matched_blocks[p] * block_tokens, largest whole-block count < prompt_tokens)
                 (vLLM always recomputes at least the last prompt token), x approximate_hit_discount
                 when the keys are approximate
    uncached_p = prompt_tokens - hit_p
    r_eff      = r_p * max(min_rate_fraction, 1 - running_p / max_num_batched_tokens)
                 (with chunked prefill every running decode takes one token of each step's budget)
    queue_p    = queued_tokens_p / r_eff                               (prefills ahead of us)
               + slot_wait_seconds * max(0, running + queued + 1 - max_num_seqs)   (batch full)
               + kv_pressure_seconds * max(0, kv_usage - kv_pressure_threshold) / (1 - threshold)
    prefill_p  = uncached_p / r_eff
    ttft_p     = queue_p + prefill_p

``queued_tokens_p`` = the uncached tokens this router has sent to *p* and not yet seen a first byte
for, plus, for requests the engine reports waiting beyond those (other router replicas, direct
clients), ``foreign_request_tokens`` each. Engine numbers older than ``stale_after_seconds`` are
ignored (the router's own counts remain). ``r_p`` is the pod's learned estimate
(:mod:`kvgate.scoring.prefill_rate`) or the ``prior_prefill_tokens_per_second``.

``load_p`` (used by load bounds and least-load) = max(router in-flight, engine running + waiting).

The model is deliberately simple and explainable: every term is shown in ``/debug/route``. It
makes the classic trade-off explicit: a pod holding *H* tokens of the prefix wins until its extra
queue delay exceeds *H / r*, so a hot prefix is replicated to a second pod exactly when waiting
for the holder costs more than recomputing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kvgate.scoring.base import CostEstimate, EndpointSnapshot, RoutingRequest


class CostModelParams(BaseModel):
    """Parameters of the TTFT cost model. Defaults suit an 8B model on one H100-class GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior_prefill_tokens_per_second: float = Field(default=10_000.0, gt=0)
    """Prefill rate assumed for a pod until the estimator has learned one."""
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    """Engine step token budget (vLLM --max-num-batched-tokens); decodes share it with prefill."""
    min_rate_fraction: float = Field(default=0.1, gt=0, le=1)
    """Floor of the decode-adjusted rate, as a fraction of the pod's rate."""
    foreign_request_tokens: int = Field(default=1024, ge=0)
    """Uncached tokens assumed for each engine-waiting request this router did not send."""
    slot_wait_seconds: float = Field(default=0.1, ge=0)
    """Added per request over the engine's max_num_seqs (waiting for a decode slot)."""
    kv_pressure_threshold: float = Field(default=0.9, ge=0, lt=1)
    """KV cache usage above which a pod is penalised (preemption risk)."""
    kv_pressure_seconds: float = Field(default=1.0, ge=0)
    """Penalty at 100% KV cache usage; linear from the threshold."""
    approximate_hit_discount: float = Field(default=0.9, ge=0, le=1)
    """Approximate keys (char blocks, routing history) may be wrong: count this share of a hit."""
    stale_after_seconds: float = Field(default=2.0, gt=0)
    """Engine-reported load older than this is ignored."""


class CostModel:
    """Computes :class:`CostEstimate` per endpoint. Stateless apart from its parameters."""

    __slots__ = ("params",)

    def __init__(self, params: CostModelParams | None = None) -> None:
        self.params = params or CostModelParams()

    def hit_tokens(self, request: RoutingRequest, matched_blocks: int) -> int:
        """Prompt tokens the pod would serve from cache, given its leading matched blocks."""
        if matched_blocks <= 0 or request.prompt_tokens <= 1:
            return 0
        bs = max(1, request.block_tokens)
        usable_blocks = (request.prompt_tokens - 1) // bs  # the last token is always computed
        hit = min(matched_blocks, usable_blocks) * bs
        if not request.keys_exact:
            hit = int(hit * self.params.approximate_hit_discount)
        return hit

    def estimate(
        self, request: RoutingRequest, endpoint: EndpointSnapshot, matched_blocks: int, now: float
    ) -> CostEstimate:
        p = self.params
        hit = self.hit_tokens(request, matched_blocks)
        uncached = max(0, request.prompt_tokens - hit)
        engine = endpoint.engine
        if engine is not None and now - engine.observed_at > p.stale_after_seconds:
            engine = None
        rate = endpoint.prefill_tokens_per_second or p.prior_prefill_tokens_per_second
        queued_tokens = float(endpoint.pending_prefill_tokens)
        queued_requests = endpoint.pending_prefill_requests
        load = endpoint.in_flight
        queue = 0.0
        if engine is not None:
            running = max(0, engine.running)
            waiting = max(0, engine.waiting)
            rate *= max(p.min_rate_fraction, 1.0 - running / p.max_num_batched_tokens)
            foreign = max(0, waiting - endpoint.pending_prefill_requests)
            queued_tokens += foreign * p.foreign_request_tokens
            queued_requests += foreign
            load = max(load, running + waiting)
            if endpoint.max_num_seqs is not None:
                over = running + queued_requests + 1 - endpoint.max_num_seqs
                if over > 0:
                    queue += over * p.slot_wait_seconds
            usage = engine.kv_cache_usage
            if usage > p.kv_pressure_threshold:
                excess = min(1.0, (usage - p.kv_pressure_threshold) / (1 - p.kv_pressure_threshold))
                queue += excess * p.kv_pressure_seconds
        queue += queued_tokens / rate
        return CostEstimate(
            endpoint_id=endpoint.id,
            hit_tokens=hit,
            uncached_tokens=uncached,
            load=load,
            prefill_tokens_per_second=rate,
            queue_seconds=queue,
            prefill_seconds=uncached / rate,
        )

    def estimate_all(
        self,
        request: RoutingRequest,
        endpoints: Sequence[EndpointSnapshot],
        matched_blocks: Mapping[str, int],
        now: float,
    ) -> dict[str, CostEstimate]:
        get = matched_blocks.get
        return {e.id: self.estimate(request, e, get(e.id, 0), now) for e in endpoints}
