"""Discrete-event mode: a whole fleet of simulated engines in virtual time, no sockets.

Each pod is the same :class:`~kvgate.sim.engine.SimEngine` the HTTP server runs. Events are
processed in time order from one heap: request arrivals and pod step starts. Arrivals win
ties, so a step includes every request that arrived at or before its start, which is the rule
the HTTP driver follows too: the same arrivals routed to the same pod give the same TTFTs in
both modes.

Routing is a plug-in: any callable ``route(request, pods, now) -> pod index`` (see
:class:`RoutingPolicy`). ``pods`` describes each pod at the arrival instant: its load, its KV
cache usage and the prefix-cache hit it would give this request (read from its real prefix
cache, as an ideal KV-event-fed directory would know it). Policies must not mutate anything.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from kvgate.prefix import HashAlgo
from kvgate.sim.engine import EngineConfig, SimEngine
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import PerformanceProfile
from kvgate.sim.request import SimRequest


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload trace."""

    request_id: str
    arrival_time: float
    prompt_token_ids: Sequence[int]
    max_tokens: int
    cache_salt: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class ArrivingRequest:
    """What a routing policy sees of a request."""

    request_id: str
    arrival_time: float
    prompt_token_ids: Sequence[int]
    block_hashes: Sequence[bytes]
    max_tokens: int
    cache_salt: str | None
    session_id: str | None


class PodState:
    """One pod as a request arrives: a read-only view, valid during the routing call.

    Values are read from the live engine when asked for, so a policy pays only for what it
    uses (the prefix hit walks the pod's prefix cache; ``pending_prefill_tokens`` walks its
    queues).
    """

    __slots__ = ("_engine", "_hashes", "_hit", "_max_hit", "index", "name")

    def __init__(
        self, index: int, name: str, engine: SimEngine, hashes: Sequence[bytes], max_hit: int
    ) -> None:
        self.index = index
        self.name = name
        self._engine = engine
        self._hashes = hashes
        self._max_hit = max_hit
        self._hit: int | None = None

    @property
    def num_running(self) -> int:
        return self._engine.num_running

    @property
    def num_waiting(self) -> int:
        return self._engine.num_waiting

    @property
    def kv_cache_usage(self) -> float:
        return self._engine.kv_cache.usage

    @property
    def block_size(self) -> int:
        return self._engine.config.block_size

    @property
    def cached_prefix_tokens(self) -> int:
        """Prompt tokens this pod's prefix cache would serve if the request arrived now."""
        if self._hit is None:
            engine = self._engine
            blocks = 0
            if engine.config.enable_prefix_caching and self._max_hit:
                blocks = engine.kv_cache.cached_prefix_blocks(self._hashes[: self._max_hit])
            self._hit = blocks * engine.config.block_size
        return self._hit

    @property
    def pending_prefill_tokens(self) -> int:
        """Prompt tokens queued or running on this pod and not computed yet."""
        sched = self._engine.scheduler
        pending = sum(r.num_tokens - r.num_computed_tokens for r in sched.waiting)
        return pending + sum(
            r.num_prompt_tokens - r.num_computed_tokens
            for r in sched.running
            if r.num_computed_tokens < r.num_prompt_tokens
        )


class RoutingPolicy(Protocol):
    def __call__(self, request: ArrivingRequest, pods: Sequence[PodState], now: float) -> int:
        """Index into ``pods`` of the pod to send ``request`` to."""
        ...


@dataclass(slots=True)
class RequestRecord:
    """The outcome of one request (times in virtual seconds)."""

    request_id: str
    pod: int
    arrival_time: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft: float
    e2e: float
    queue_time: float
    preemptions: int


@dataclass
class FleetResult:
    records: list[RequestRecord] = field(default_factory=list)
    steps: int = 0
    end_time: float = 0.0
    rejected: list[str] = field(default_factory=list)


class DESFleet:
    """A fleet of simulated pods driven in virtual time by :meth:`run`."""

    def __init__(
        self,
        num_pods: int,
        config: EngineConfig,
        profile: PerformanceProfile,
        hash_algo: HashAlgo = "sha256",
        hash_seed: str | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        if num_pods < 1:
            raise ValueError("a fleet needs at least one pod")
        self.hasher = PrefixBlockHasher(hash_algo, config.block_size, hash_seed)
        self.engines = [
            SimEngine(_with_seed(config, config.seed + i), profile, self.hasher)
            for i in range(num_pods)
        ]
        self.names = list(names) if names else [f"pod-{i}" for i in range(num_pods)]
        self.block_size = config.block_size

    def pod_states(self, block_hashes: Sequence[bytes], max_hit_blocks: int) -> list[PodState]:
        return [
            PodState(i, self.names[i], engine, block_hashes, max_hit_blocks)
            for i, engine in enumerate(self.engines)
        ]

    def run(self, trace: Iterable[TraceRequest], route: RoutingPolicy) -> FleetResult:
        """Replay ``trace`` (sorted by arrival time) through ``route`` until every request ends."""
        result = FleetResult()
        heap: list[tuple[float, int, int]] = []  # (time, 0 arrival | 1 step, pod or -1)
        scheduled = [False] * len(self.engines)
        last_end = [0.0] * len(self.engines)
        routed: dict[SimRequest, int] = {}
        arrivals = iter(trace)
        pending_arrival = next(arrivals, None)
        while pending_arrival is not None or heap:
            if pending_arrival is not None and (
                not heap or pending_arrival.arrival_time <= heap[0][0]
            ):
                item = pending_arrival
                pending_arrival = next(arrivals, None)
                if pending_arrival is not None and pending_arrival.arrival_time < item.arrival_time:
                    raise ValueError("the trace must be sorted by arrival time")
                pod = self._admit(item, route, routed, result)
                if pod is not None and not scheduled[pod]:
                    start = self.engines[pod].next_step_time(last_end[pod])
                    if start is not None:
                        heapq.heappush(heap, (start, 1, pod))
                        scheduled[pod] = True
                continue
            now, _kind, pod = heapq.heappop(heap)
            scheduled[pod] = False
            engine = self.engines[pod]
            step = engine.step(now)
            result.steps += 1
            last_end[pod] = step.end
            result.end_time = max(result.end_time, step.end)
            for req in step.finished:
                result.records.append(_record(req, routed.pop(req)))
            start = engine.next_step_time(step.end)
            if start is not None:
                heapq.heappush(heap, (start, 1, pod))
                scheduled[pod] = True
        return result

    def _admit(
        self,
        item: TraceRequest,
        route: RoutingPolicy,
        routed: dict[SimRequest, int],
        result: FleetResult,
    ) -> int | None:
        tokens = list(item.prompt_token_ids)
        hashes = self.hasher.prompt_hashes(tokens, item.cache_salt) if tokens else []
        request = ArrivingRequest(
            request_id=item.request_id,
            arrival_time=item.arrival_time,
            prompt_token_ids=tokens,
            block_hashes=hashes,
            max_tokens=item.max_tokens,
            cache_salt=item.cache_salt,
            session_id=item.session_id,
        )
        max_hit = max(len(tokens) - 1, 0) // self.block_size
        pod = route(request, self.pod_states(hashes, max_hit), item.arrival_time)
        if not 0 <= pod < len(self.engines):
            raise ValueError(f"routing policy returned pod {pod} of {len(self.engines)}")
        try:
            req = self.engines[pod].add_request(
                item.request_id,
                tokens,
                item.max_tokens,
                item.arrival_time,
                item.cache_salt,
                block_hashes=hashes,
            )
        except ValueError:
            result.rejected.append(item.request_id)
            return None
        routed[req] = pod
        return pod


def _with_seed(config: EngineConfig, seed: int) -> EngineConfig:
    return replace(config, seed=seed)


def _record(req: SimRequest, pod: int) -> RequestRecord:
    first = req.first_token_time if req.first_token_time is not None else req.arrival_time
    finish = req.finish_time if req.finish_time is not None else first
    scheduled = req.first_scheduled_time if req.first_scheduled_time is not None else first
    return RequestRecord(
        request_id=req.request_id,
        pod=pod,
        arrival_time=req.arrival_time,
        prompt_tokens=req.num_prompt_tokens,
        cached_tokens=max(req.num_cached_tokens, 0),
        output_tokens=len(req.output_token_ids),
        ttft=first - req.arrival_time,
        e2e=finish - req.arrival_time,
        queue_time=scheduled - req.arrival_time,
        preemptions=req.num_preemptions,
    )


def round_robin() -> RoutingPolicy:
    """Baseline policy: pods in turn."""
    counter = iter(range(1 << 62))

    def route(request: ArrivingRequest, pods: Sequence[PodState], now: float) -> int:
        return next(counter) % len(pods)

    return route


def least_loaded(request: ArrivingRequest, pods: Sequence[PodState], now: float) -> int:
    """Baseline policy: fewest running + waiting requests (lowest index on ties)."""
    return min(pods, key=lambda p: (p.num_running + p.num_waiting, p.index)).index


def longest_prefix(request: ArrivingRequest, pods: Sequence[PodState], now: float) -> int:
    """Baseline policy: the largest prefix-cache hit, then the least loaded."""
    return min(
        pods, key=lambda p: (-p.cached_prefix_tokens, p.num_running + p.num_waiting, p.index)
    ).index
