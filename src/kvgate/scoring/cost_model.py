"""Predicted time to first token (TTFT) of a request on each endpoint.

For endpoint *p* with prefill rate *r_p* (tokens/s):

    hit_p      = min(matched_blocks[p] * block_tokens, largest whole-block count < prompt_tokens)
                 (vLLM always recomputes at least the last prompt token), x approximate_hit_discount
                 when the keys are approximate
    uncached_p = prompt_tokens - hit_p
    cpu_hit_p  = the part of hit_p held only in the pod's CPU offloading tier (pools with
                 `cpu_offload`: hit_p minus the hit of the pod's leading GPU blocks)
    r_eff      = r_p * max(min_rate_fraction, 1 - running_p / max_num_batched_tokens)
                 (with chunked prefill every running decode takes one token of each step's budget)
    queue_p    = queued_tokens_p / r_eff                               (prefills ahead of us)
               + slot_wait_seconds * max(0, running + queued + 1 - max_num_seqs)   (batch full)
               + kv_pressure_seconds * max(0, kv_usage - kv_pressure_threshold) / (1 - threshold)
               + lora_load_seconds      if the request names a LoRA adapter that none of the
                                        pod's running or waiting requests uses and that is
                                        not among the max_lora it used last (its GPU slots)
               + lora_slot_wait_seconds if no running request uses it and the running ones
                                        already use max_lora adapters (vLLM keeps it waiting)
    prefill_p  = uncached_p / r_eff + cpu_hit_p / cpu_load_tokens_per_second
    ttft_p     = queue_p + prefill_p
    decode_p   = expected_output_tokens * decode_seconds_per_kv_token
                 * (kv_usage_p * kv_capacity_tokens_p + pending_prefill_tokens_p)

``decode_p`` is not part of the TTFT: it is how much longer the answer's decode takes on *p*
than on a pod running nothing. Each decode step reads the KV cache of every running request
(memory bound), so a pod whose running requests hold more KV steps slower; the requests this
router sent there and that have not started will hold theirs too. ``expected_output_tokens``
is learned from the pool's answers (:mod:`kvgate.scoring.output_length`); while it is unknown,
or the pod reports no KV cache size, ``decode_p`` is 0.

``queued_tokens_p`` = the uncached tokens this router has sent to *p* and not yet seen a first byte
for, plus, for requests the engine reports waiting beyond those (other router replicas, direct
clients), ``foreign_request_tokens`` each; "those" are counted when the engine was scraped
(``EngineLoad.pending_at_scrape``), since its waiting count is as old as the scrape. A pod with
no fresh engine report (``EndpointSnapshot.engine`` is None) is priced on the router's own
counts.
``r_p`` is the pod's learned estimate (:mod:`kvgate.scoring.prefill_rate`); for a pod not
measured yet, the mean learned rate of the candidates of the same pool that are measured, and
only when none is, the ``prior_prefill_tokens_per_second``. (With the prior alone, an
unmeasured pod on fast hardware looked several times slower than its measured peers, got no
traffic and so was never measured.)

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
    cpu_load_tokens_per_second: float = Field(default=380_000.0, gt=0)
    """How fast a CPU-tier hit is copied back to the GPU (pools with `cpu_offload`): host-to-
    device bandwidth over KV bytes per token. Default: PCIe Gen5 x16 at ~50 GB/s over
    Llama-3.1-8B's 128 KiB a token, 38x the default prefill prior (docs/scoring.md)."""
    lora_load_seconds: float = Field(default=0.05, ge=0)
    """Added on a pod whose running and waiting requests do not use the request's LoRA adapter
    (``vllm:lora_requests_info``) and that did not use it among its last ``max_lora`` adapters:
    it has to load the adapter into a GPU slot first."""
    lora_slot_wait_seconds: float = Field(default=1.0, ge=0)
    """Added when no running request of the pod uses the adapter and its batch already uses
    ``max_lora`` others: vLLM keeps the request waiting until one of them has none left."""
    decode_seconds_per_kv_token: float = Field(default=4.9e-8, ge=0)
    """Time a decode step spends reading one token of KV cache: KV bytes per token over the
    memory bandwidth decode reaches. Default: Llama-3.1-8B's 128 KiB a token over 0.8 of an
    H100's 3.35 TB/s (docs/scoring.md)."""


class CostModel:
    """Computes :class:`CostEstimate` per endpoint. Stateless apart from its parameters."""

    __slots__ = (
        "_approx",
        "_cpu_rate",
        "_decode_kv",
        "_foreign",
        "_kv_seconds",
        "_kv_threshold",
        "_lora_load",
        "_lora_slot_wait",
        "_max_batched",
        "_min_fraction",
        "_prior",
        "_slot_wait",
        "params",
    )

    def __init__(self, params: CostModelParams | None = None) -> None:
        p = self.params = params or CostModelParams()
        # Plain floats for the hot path (called once per endpoint per decision).
        self._prior = p.prior_prefill_tokens_per_second
        self._max_batched = float(p.max_num_batched_tokens)
        self._min_fraction = p.min_rate_fraction
        self._foreign = p.foreign_request_tokens
        self._slot_wait = p.slot_wait_seconds
        self._kv_threshold = p.kv_pressure_threshold
        self._kv_seconds = p.kv_pressure_seconds
        self._approx = p.approximate_hit_discount
        self._cpu_rate = p.cpu_load_tokens_per_second
        self._lora_load = p.lora_load_seconds
        self._lora_slot_wait = p.lora_slot_wait_seconds
        self._decode_kv = p.decode_seconds_per_kv_token

    def hit_tokens(self, request: RoutingRequest, matched_blocks: int) -> int:
        """Prompt tokens the pod would serve from cache, given its leading matched blocks."""
        if matched_blocks <= 0 or request.prompt_tokens <= 1:
            return 0
        bs = request.block_tokens if request.block_tokens > 0 else 1
        usable_blocks = (request.prompt_tokens - 1) // bs  # the last token is always computed
        hit = (matched_blocks if matched_blocks < usable_blocks else usable_blocks) * bs
        if not request.keys_exact:
            hit = int(hit * self._approx)
        return hit

    def unmeasured_rates(self, endpoints: Sequence[EndpointSnapshot]) -> dict[str, float]:
        """Rate for an unmeasured pod, per pool: the mean learned rate of that pool's measured
        endpoints among ``endpoints``; pools without any are absent (the prior applies)."""
        sums: dict[str, tuple[float, int]] = {}
        for e in endpoints:
            r = e.prefill_tokens_per_second
            if r:
                total, n = sums.get(e.pool, (0.0, 0))
                sums[e.pool] = (total + r, n + 1)
        return {pool: total / n for pool, (total, n) in sums.items()}

    def estimate(
        self,
        request: RoutingRequest,
        endpoint: EndpointSnapshot,
        matched_blocks: int,
        unmeasured_rate: float | None = None,
        gpu_blocks: int | None = None,
    ) -> CostEstimate:
        """``unmeasured_rate`` replaces the prior when the endpoint has no learned rate;
        ``gpu_blocks``: how many of the matched blocks lead on the GPU (None: all of them)."""
        hit = self.hit_tokens(request, matched_blocks) if matched_blocks > 0 else 0
        uncached = request.prompt_tokens - hit
        if uncached < 0:
            uncached = 0
        cpu_hit = 0
        if gpu_blocks is not None and gpu_blocks < matched_blocks and hit:
            cpu_hit = hit - (self.hit_tokens(request, gpu_blocks) if gpu_blocks > 0 else 0)
        rate = endpoint.prefill_tokens_per_second or unmeasured_rate or self._prior
        queued_tokens = float(endpoint.pending_prefill_tokens)
        load = endpoint.in_flight
        queue = 0.0
        decode = 0.0
        engine = endpoint.engine
        if engine is not None:
            running = engine.running if engine.running > 0 else 0
            waiting = engine.waiting if engine.waiting > 0 else 0
            fraction = 1.0 - running / self._max_batched
            rate *= fraction if fraction > self._min_fraction else self._min_fraction
            foreign = engine.foreign_waiting(endpoint.pending_prefill_requests)
            if foreign:
                queued_tokens += foreign * self._foreign
            if running + waiting > load:
                load = running + waiting
            if endpoint.max_num_seqs is not None:
                over = running + endpoint.pending_prefill_requests + foreign + 1
                over -= endpoint.max_num_seqs
                if over > 0:
                    queue += over * self._slot_wait
            usage = engine.kv_cache_usage
            if request.expected_output_tokens and engine.kv_capacity_tokens:
                active = usage * engine.kv_capacity_tokens + endpoint.pending_prefill_tokens
                decode = request.expected_output_tokens * self._decode_kv * active
            if usage > self._kv_threshold:
                excess = (usage - self._kv_threshold) / (1.0 - self._kv_threshold)
                queue += (excess if excess < 1.0 else 1.0) * self._kv_seconds
            adapter = request.lora_adapter
            if adapter is not None and engine.max_lora > 0:
                running_loras = engine.running_lora_adapters
                if adapter not in running_loras:
                    if (
                        adapter not in engine.waiting_lora_adapters
                        and adapter not in engine.recent_lora_adapters
                    ):
                        queue += self._lora_load
                    if len(running_loras) >= engine.max_lora:
                        queue += self._lora_slot_wait
        queue += queued_tokens / rate
        prefill = uncached / rate
        if cpu_hit:
            prefill += cpu_hit / self._cpu_rate
        return CostEstimate(endpoint.id, hit, uncached, load, rate, queue, prefill, cpu_hit, decode)

    def estimate_all(
        self,
        request: RoutingRequest,
        endpoints: Sequence[EndpointSnapshot],
        matched_blocks: Mapping[str, int],
    ) -> dict[str, CostEstimate]:
        get = matched_blocks.get
        estimate = self.estimate
        peers = self.unmeasured_rates(endpoints)
        on_gpu = request.gpu_matched_blocks
        if on_gpu is None:
            return {e.id: estimate(request, e, get(e.id, 0), peers.get(e.pool)) for e in endpoints}
        return {
            e.id: estimate(request, e, get(e.id, 0), peers.get(e.pool), on_gpu.get(e.id, 0))
            for e in endpoints
        }
