"""The simulated engine: KV cache + scheduler + performance profile, stepped in virtual time.

The engine never reads a clock. A driver (the HTTP server's loop or the discrete-event fleet)
asks :meth:`SimEngine.next_step_time` when the next step may start, calls :meth:`SimEngine.step`
with that time and receives when the step ends, the token each request produced and the
finished requests. The rule both drivers follow: a step starts at the end of the previous one,
or, when the engine is idle, at the arrival of the next request; a step includes exactly the
requests that arrived at or before its start. The same arrivals therefore give the same TTFTs in
both modes.

Generated tokens are a deterministic function of the seed, the prompt and the position, so the
same request produces the same output (and the same decode-block hashes) on every run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvgate.kvevents import KVEvent
from kvgate.prefix.cache_ops import OpHistory
from kvgate.sim.kv_cache import KVCacheManager
from kvgate.sim.lora import LoraConfig, LoraModule, LoraSlots
from kvgate.sim.profile import PerformanceProfile
from kvgate.sim.request import BlockHasher, SimRequest, Status
from kvgate.sim.scheduler import Scheduler, SchedulerConfig

_FIRST_OUTPUT_TOKEN_ID = 100


def _rotated_tokens(req: SimRequest, start: int, end: int) -> int:
    """Active tokens re-rotated by the repositions at offsets in (start, end]: a step that
    computes up to a reposition then renumbers the positions of what is left."""
    assert req.history is not None
    return sum(req.active_tokens(at) for at in req.history.repositions_in(start, end))


class RequestRejected(ValueError):
    """A request vLLM would refuse with a 400 (e.g. longer than ``max_model_len``)."""


@dataclass
class EngineConfig:
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: derived from the profile and memory utilisation
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    seed: int = 0
    vocab_size: int = 32000
    # vLLM --kv-offloading-size (GiB of host memory for the CPU offloading tier; 0 = none)
    kv_offloading_size_gib: float = 0.0
    lora: LoraConfig | None = None  # None: --enable-lora not given


def kv_cache_blocks(config: EngineConfig, profile: PerformanceProfile) -> int:
    """``num_gpu_blocks`` of an engine with ``config`` on ``profile``: the override, else what fits
    in the memory vLLM may use (block 0 of them is vLLM's null block)."""
    return config.num_gpu_blocks or profile.num_gpu_blocks(
        config.block_size, config.gpu_memory_utilization
    )


@dataclass
class EngineStats:
    """Monotonic counters behind the ``vllm:*_total`` metrics, and the step counters the
    discrete-event bench reports (where a request's decode time goes)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_cached: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    busy_seconds: float = 0.0  # time spent in steps
    prefill_steps: int = 0  # steps that computed prompt tokens
    prefill_step_seconds: float = 0.0
    decodes_in_prefill_steps: int = 0  # decoding sequences those steps held up


@dataclass
class StepResult:
    start: float
    end: float
    tokens: list[tuple[SimRequest, int]] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    events: list[KVEvent] = field(default_factory=list)
    num_preempted: int = 0


class SimEngine:
    def __init__(
        self, config: EngineConfig, profile: PerformanceProfile, hasher: BlockHasher
    ) -> None:
        self.config = config
        self.profile = profile
        self.hasher = hasher
        self.num_gpu_blocks = kv_cache_blocks(config, profile)
        capacity = (self.num_gpu_blocks - 1) * config.block_size
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} is larger than the KV cache "
                f"({capacity} tokens); lower --max-model-len or raise the memory"
            )
        self.stats = EngineStats()
        self._start_fresh()

    def _start_fresh(self) -> None:
        self.kv_cache = KVCacheManager(
            self.num_gpu_blocks,
            self.config.block_size,
            self.config.enable_prefix_caching,
            num_cpu_blocks=self.profile.num_cpu_blocks(
                self.config.block_size, self.config.kv_offloading_size_gib
            ),
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_model_len=self.config.max_model_len,
                max_loras=self.config.lora.max_loras if self.config.lora else None,
            ),
            self.kv_cache,
        )
        self.lora_slots = LoraSlots(self.config.lora.max_loras if self.config.lora else 0)

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        arrival_time: float,
        cache_salt: str | None = None,
        block_hashes: list[bytes] | None = None,
        lora: LoraModule | None = None,
        history: OpHistory | None = None,
    ) -> SimRequest:
        """Queue a request; ``block_hashes`` may carry its prompt's hashes, already computed;
        ``lora``: the adapter it names (one of the engine's ``--lora-modules``); ``history``:
        its AKV cache ops (positions then count what repositions left)."""
        n = len(prompt_token_ids)
        if n == 0:
            raise RequestRejected("The prompt cannot be empty.")
        if history is not None:
            n = history.positions(n)
        limit = self.config.max_model_len
        if n >= limit:
            raise RequestRejected(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n} input tokens. Please reduce the length of the input messages."
            )
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}.")
        if n + max_tokens > limit:
            raise RequestRejected(
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length "
                f"is {limit} tokens and your request has {n} input tokens "
                f"({max_tokens} > {limit} - {n})."
            )
        req = SimRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            max_tokens=max_tokens,
            arrival_time=arrival_time,
            cache_salt=cache_salt,
            lora=lora,
        )
        if history is not None and history.points:
            req.set_history(history, self.config.block_size)
        if self.config.enable_prefix_caching:
            if block_hashes is not None:
                req.block_hashes = list(block_hashes)
            req.update_block_hashes(self.hasher, self.config.block_size)
        self.scheduler.add(req)
        return req

    def abort(self, request: SimRequest) -> None:
        if not request.is_finished:
            self.scheduler.abort(request)

    # -- stepping --------------------------------------------------------------------------

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def lora_adapters(self) -> tuple[list[str], list[str]]:
        """Adapter names of the running and of the waiting requests (vLLM's scheduler stats)."""

        def names(requests: Iterable[SimRequest]) -> list[str]:
            return list(dict.fromkeys(r.lora.name for r in requests if r.lora is not None))

        return names(self.scheduler.running), names(self.scheduler.waiting)

    def next_step_time(self, not_before: float) -> float | None:
        """When the next step starts if the previous one ended at ``not_before``."""
        if self.scheduler.running:
            return not_before
        arrival = self.scheduler.next_arrival()
        if arrival is None:
            return None
        return max(not_before, arrival)

    def step(self, now: float) -> StepResult:
        batch = self.scheduler.schedule(now)
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        rotated = 0  # AKV: active tokens whose keys a reposition re-rotates in this step
        for req, num_new, context in batch.items:
            if req.history is not None:  # attention reads what the drops left
                rotated += _rotated_tokens(req, context, context + num_new)
                active = req.active_tokens(context)
                self.kv_cache.release_dropped(req)
            else:
                active = context
            if num_new == 1 and req.output_token_ids and context == len(req.all_token_ids) - 1:
                decode.append(active)
            else:
                prefill.append((active, num_new))
        end = now + self.profile.step_seconds(prefill, decode)
        if rotated:
            end += self.profile.reposition_seconds(rotated)
        if batch.loaded_tokens:  # copies from the CPU tier, modelled as part of the step
            end += self.profile.load_seconds(batch.loaded_tokens)
        if self.config.lora is not None:
            adapters = {req.lora.name for req, _n, _c in batch.items if req.lora is not None}
            end += self.lora_slots.use(sorted(adapters)) * self.config.lora.load_seconds
        result = StepResult(start=now, end=end, num_preempted=len(batch.preempted))
        stats = self.stats
        stats.busy_seconds += end - now
        if prefill:
            stats.prefill_steps += 1
            stats.prefill_step_seconds += end - now
            stats.decodes_in_prefill_steps += len(decode)
        if batch.preempted:
            stats.preemptions += len(batch.preempted)
        for queried, hit in batch.prefix_lookups:
            stats.prefix_cache_queries += queried
            stats.prefix_cache_hits += hit
        finished: list[SimRequest] = []
        tokens = result.tokens
        caching = self.config.enable_prefix_caching
        block_size = self.config.block_size
        max_model_len = self.config.max_model_len
        for req, _num_new, _context in batch.items:
            all_tokens = req.all_token_ids
            if req.num_computed_tokens < len(all_tokens):
                continue  # a prefill chunk that does not finish the prompt samples nothing
            token = self._next_token(req)
            req.output_token_ids.append(token)
            all_tokens.append(token)
            if caching and (len(req.block_hashes) + 1) * block_size <= len(all_tokens):
                req.update_block_hashes(self.hasher, block_size)
            if req.first_token_time is None:
                req.first_token_time = end
                req.prefill_done_time = end
                stats.prompt_tokens += req.num_prompt_tokens
                stats.prompt_tokens_cached += max(req.num_cached_tokens, 0)
            req.last_token_time = end
            tokens.append((req, token))
            if len(req.output_token_ids) >= req.max_tokens or len(all_tokens) >= max_model_len:
                req.finish_time = end
                finished.append(req)
        stats.generation_tokens += len(tokens)
        if finished:
            self.scheduler.finish(finished)
            stats.finished_requests += len(finished)
            result.finished = finished
        result.events = self.kv_cache.take_events()
        return result

    def run_until_idle(self, now: float = 0.0) -> list[StepResult]:
        """Step until no request is left (a single-engine driver for tests and tools)."""
        steps: list[StepResult] = []
        while (start := self.next_step_time(now)) is not None:
            result = self.step(start)
            steps.append(result)
            now = result.end
        return steps

    def _next_token(self, req: SimRequest) -> int:
        position = len(req.output_token_ids)
        mix = (
            self.config.seed * 2654435761
            + req.num_prompt_tokens * 40503
            + req.prompt_token_ids[-1] * 7919
            + position * 97
        )
        return _FIRST_OUTPUT_TOKEN_ID + mix % (self.config.vocab_size - _FIRST_OUTPUT_TOKEN_ID)

    # -- admin -----------------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: refused while requests hold blocks.

        The ``AllBlocksCleared`` event is delivered with the next step, as in vLLM, where an
        idle engine publishes nothing.
        """
        return self.kv_cache.reset_prefix_cache()

    def restart(self) -> list[SimRequest]:
        """Lose all state as a restarted engine process does; returns the aborted requests."""
        lost = list(self.scheduler.running) + list(self.scheduler.waiting)
        for req in lost:
            req.status = Status.FINISHED
        self._start_fresh()
        self.stats = EngineStats()
        return lost
