"""Continuous batching as vLLM v1's scheduler does it (FCFS policy, chunked prefill on).

Each step has a token budget (``max_num_batched_tokens``):

1. Running requests first, in order: each asks for the tokens it still has to compute (the rest
   of its prompt, chunked to the budget, or one decode token). If the KV cache cannot hold them,
   the most recently admitted running request is preempted by recompute (its blocks are freed,
   its progress reset, and it goes back to the front of the waiting queue) until the request fits
   or is itself preempted.
2. If nothing was preempted, waiting requests are admitted in order while the budget lasts and
   fewer than ``max_num_seqs`` run: a request's prefix-cache hit is looked up when it is first
   admitted (or re-admitted after preemption), continued into the CPU offloading tier (those
   blocks are loaded back, not computed), its remaining prompt is chunked to the budget, and
   admission stops at the first request whose blocks do not fit.

A request that arrives after the step starts (``arrival_time > now``) waits for the next step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvgate.sim.kv_cache import KVCacheManager
from kvgate.sim.request import SimRequest, Status


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    max_loras: int | None = None  # distinct LoRA adapters per batch; None: LoRA off


@dataclass
class ScheduledBatch:
    """What one step computes: ``(request, tokens, context already computed)`` per request."""

    items: list[tuple[SimRequest, int, int]] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    # Per newly admitted request: (prompt tokens looked up, tokens hit) for the prefix metrics.
    prefix_lookups: list[tuple[int, int]] = field(default_factory=list)
    # Tokens copied back from the CPU offloading tier this step (their transfer takes time).
    loaded_tokens: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []

    def add(self, request: SimRequest) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def next_arrival(self) -> float | None:
        """Arrival time of the first waiting request (None when none waits)."""
        return self.waiting[0].arrival_time if self.waiting else None

    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        kv = self.kv_cache
        scheduled: dict[SimRequest, int] = {}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(len(req.all_token_ids) - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            fits = True
            while not kv.allocate_slots(req, num_new):
                victim = self.running.pop()
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            scheduled[req] = num_new
            budget -= num_new
            i += 1

        if not batch.preempted:
            self._admit_waiting(now, budget, scheduled, batch)

        for req, num_new in scheduled.items():
            batch.items.append((req, num_new, req.num_computed_tokens))
            req.num_computed_tokens += num_new
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        return batch

    def _admit_waiting(
        self, now: float, budget: int, scheduled: dict[SimRequest, int], batch: ScheduledBatch
    ) -> None:
        kv = self.kv_cache
        bs = kv.block_size
        max_loras = self.config.max_loras
        loras = {r.lora.name for r in self.running if r.lora is not None}
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[i]
            if req.arrival_time > now:
                break
            if (
                req.lora is not None
                and max_loras is not None
                and req.lora.name not in loras
                and len(loras) >= max_loras
            ):
                i += 1  # vLLM skips it (no free adapter slot) and keeps its place
                continue
            first = req.num_computed_tokens == 0
            computed = kv.get_computed_blocks(req) if first else []
            # Blocks after the GPU hit that the CPU tier holds: new GPU blocks, filled by a copy.
            loaded = kv.cpu_hit_blocks(req, len(computed)) if first else 0
            num_hit = (len(computed) + loaded) * bs
            num_new = min(req.num_tokens - req.num_computed_tokens - num_hit, budget)
            if not kv.allocate_slots(req, loaded * bs + num_new, computed):
                break
            if loaded:
                kv.touch_cpu(req, len(computed), loaded)
                batch.loaded_tokens += loaded * bs
            del self.waiting[i]
            if req.lora is not None:
                loras.add(req.lora.name)
            self.running.append(req)
            req.status = Status.RUNNING
            req.num_computed_tokens += num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
                batch.prefix_lookups.append((req.num_tokens, num_hit))
            scheduled[req] = num_new
            budget -= num_new

    def _preempt(self, req: SimRequest) -> None:
        self.kv_cache.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def finish(self, requests: list[SimRequest]) -> None:
        """Remove finished requests from the running set and free their blocks."""
        if not requests:
            return
        done = set(requests)
        self.running = [r for r in self.running if r not in done]
        for req in requests:
            req.status = Status.FINISHED
            self.kv_cache.free(req)

    def abort(self, request: SimRequest) -> None:
        """Drop a request wherever it is (client went away)."""
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.kv_cache.free(request)
        request.status = Status.FINISHED
