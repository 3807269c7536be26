"""Discrete-event mode: a whole fleet of simulated engines in virtual time, no sockets.

Each pod is the same :class:`~kvgate.sim.engine.SimEngine` the HTTP server runs. One heap orders
four kinds of events; at equal times they run in this order:

1. **tick**: the driver's periodic callback (every ``driver.tick_interval_s``), e.g. a router's
   load scrape or a benchmark's load sampler;
2. **delivery**: what a step produced, delivered at the step's end (the time a real client and
   router would see it): first tokens, finished requests, the KV events the engine published;
3. **arrival**: a request is routed (``driver.route``) and added to its pod;
4. **step**: a pod starts its next step. Arrivals win ties with steps, so a step includes every
   request that arrived at or before its start, which is the rule the HTTP driver follows too:
   the same arrivals routed to the same pods give the same TTFTs in both modes.

Routing and everything around it is a plug-in, a :class:`FleetDriver`: ``route`` chooses a pod
for each arrival (or none: refused, or held back in a router's queue); the other hooks (no-ops
by default) see first tokens, finished requests (and may answer with follow-up requests:
closed-loop sessions), rejections, KV events and ticks, and after each tick and delivery
``released`` lets held-back requests arrive.
``kvgate.bench.des_driver`` drives kvgate's own routing core through these hooks; :func:`routed_by`
wraps a plain function of the request and the pods' current state (:class:`PodState`, read
from their real prefix caches, as an ideal KV-event-fed directory would know them).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from kvgate.kvevents import KVEvent
from kvgate.prefix import HashAlgo
from kvgate.prefix.cache_ops import OpHistory
from kvgate.sim.engine import EngineConfig, SimEngine, StepResult
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
    history: OpHistory | None = None  # AKV cache ops; used by a fleet with cache_ops only


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


class FleetDriver:
    """The plug-in of a discrete-event run. ``route`` is required; every other hook is a no-op
    unless overridden. Times are virtual seconds; hooks must not mutate the engines."""

    #: seconds between ``tick`` calls; None = never
    tick_interval_s: float | None = None

    def route(self, request: TraceRequest, fleet: DESFleet, now: float) -> int | None:
        """Index of the pod that gets ``request``; None = no pod does (the router refused it)."""
        raise NotImplementedError

    def engine_block_hashes(self, request: TraceRequest) -> Sequence[bytes] | None:
        """The prompt's block hashes if routing computed them (the engine then reuses them
        instead of hashing again); None = let the engine hash."""
        return None

    def rejected(self, request: TraceRequest, pod: int, error: str, now: float) -> None:
        """The pod refused the request (what vLLM answers with a 400)."""

    def first_token(self, request: SimRequest, pod: int, now: float) -> None:
        """``request``'s first token reached the client."""

    def finished(self, request: SimRequest, pod: int, now: float) -> Iterable[TraceRequest]:
        """``request`` ended; returns requests to add (arrival times >= ``now``)."""
        return ()

    def kv_events(self, pod: int, events: Sequence[KVEvent], now: float) -> None:
        """One step's KV events, as the pod publishes them."""

    def tick(self, fleet: DESFleet, now: float) -> Iterable[TraceRequest]:
        """Periodic callback (``tick_interval_s``); may add pods (:meth:`DESFleet.add_pod`) and
        returns requests to add (arrival times >= ``now``)."""
        return ()

    def holding(self) -> bool:
        """The driver still holds requests back: the run goes on (ticking) until it lets go."""
        return False

    def released(self, now: float) -> Iterable[TraceRequest]:
        """Requests the driver held back (a router's queue) and lets go now, after a tick or a
        delivery: they arrive at ``now``."""
        return ()


RouteFn = Callable[[TraceRequest, Sequence[PodState], float], int]


class _FunctionDriver(FleetDriver):
    def __init__(self, route: RouteFn) -> None:
        self._route = route
        self._hashes: tuple[str, Sequence[bytes]] = ("", ())

    def route(self, request: TraceRequest, fleet: DESFleet, now: float) -> int:
        tokens = request.prompt_token_ids
        history = request.history if fleet.cache_ops else None
        hashes = (
            fleet.hasher.prompt_hashes(tokens, request.cache_salt, history=history)
            if tokens
            else []
        )
        self._hashes = (request.request_id, hashes)
        max_hit = max(len(tokens) - 1, 0) // fleet.block_size
        return self._route(request, fleet.pod_states(hashes, max_hit), now)

    def engine_block_hashes(self, request: TraceRequest) -> Sequence[bytes] | None:
        request_id, hashes = self._hashes
        return hashes if request_id == request.request_id else None


def routed_by(route: RouteFn) -> FleetDriver:
    """A driver that only routes, with ``route(request, pods, now) -> pod index``."""
    return _FunctionDriver(route)


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


# event kinds, in their order at equal times
_TICK, _DELIVERY, _ARRIVAL, _STEP = range(4)


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
        cache_ops: bool = False,
    ) -> None:
        """``cache_ops``: the pods run with ``--sim-akv`` (they apply a request's op history;
        other pods ignore it, as vLLM ignores the `cache` field)."""
        if num_pods < 1:
            raise ValueError("a fleet needs at least one pod")
        self.hasher = PrefixBlockHasher(hash_algo, config.block_size, hash_seed)
        self.engines = [
            SimEngine(replace(config, seed=config.seed + i), profile, self.hasher)
            for i in range(num_pods)
        ]
        self.names = list(names) if names else [f"pod-{i}" for i in range(num_pods)]
        self.block_size = config.block_size
        self.cache_ops = cache_ops
        self._config, self._profile = config, profile

    def add_pod(self, name: str) -> int:
        """A pod joins the fleet (a scale-up) with an empty cache; returns its index."""
        index = len(self.engines)
        config = replace(self._config, seed=self._config.seed + index)
        self.engines.append(SimEngine(config, self._profile, self.hasher))
        self.names.append(name)
        return index

    def pod_states(self, block_hashes: Sequence[bytes], max_hit_blocks: int) -> list[PodState]:
        return [
            PodState(i, self.names[i], engine, block_hashes, max_hit_blocks)
            for i, engine in enumerate(self.engines)
        ]

    def run(self, trace: Iterable[TraceRequest], driver: FleetDriver) -> FleetResult:
        """Replay ``trace`` (sorted by arrival time) and the driver's follow-up requests until
        every request has ended."""
        result = FleetResult()
        heap: list[tuple[float, int, int, object]] = []  # (time, kind, order, payload)
        order = itertools.count()
        scheduled = [False] * len(self.engines)  # a step is queued, or running until delivery
        routed: dict[SimRequest, int] = {}
        arrivals = iter(trace)
        upcoming = next(arrivals, None)
        interval = driver.tick_interval_s
        if interval is not None:
            heapq.heappush(heap, (0.0, _TICK, next(order), None))

        def schedule_step(pod: int, not_before: float) -> None:
            if scheduled[pod]:
                return
            start = self.engines[pod].next_step_time(not_before)
            if start is not None:
                heapq.heappush(heap, (start, _STEP, next(order), pod))
                scheduled[pod] = True

        while (
            upcoming is not None
            or len(heap) > (interval is not None)
            or (interval is not None and driver.holding())
        ):
            if upcoming is not None and (
                not heap or (upcoming.arrival_time, _ARRIVAL) <= heap[0][:2]
            ):
                item, upcoming = upcoming, next(arrivals, None)
                if upcoming is not None and upcoming.arrival_time < item.arrival_time:
                    raise ValueError("the trace must be sorted by arrival time")
                pod = self._admit(item, driver, routed, result)
                if pod is not None:
                    schedule_step(pod, item.arrival_time)
                continue
            now, kind, _, payload = heapq.heappop(heap)
            if kind == _TICK:
                for added in driver.tick(self, now):
                    if added.arrival_time < now:
                        raise ValueError("a request cannot arrive in the past")
                    heapq.heappush(heap, (added.arrival_time, _ARRIVAL, next(order), added))
                scheduled.extend([False] * (len(self.engines) - len(scheduled)))  # pods added
                assert interval is not None
                heapq.heappush(heap, (now + interval, _TICK, next(order), None))
                for held in driver.released(now):
                    heapq.heappush(heap, (now, _ARRIVAL, next(order), held))
            elif kind == _ARRIVAL:
                assert isinstance(payload, TraceRequest)
                pod = self._admit(payload, driver, routed, result)
                if pod is not None:
                    schedule_step(pod, now)
            elif kind == _STEP:
                assert isinstance(payload, int)
                step = self.engines[payload].step(now)
                result.steps += 1
                result.end_time = max(result.end_time, step.end)
                heapq.heappush(heap, (step.end, _DELIVERY, next(order), (payload, step)))
            else:
                assert isinstance(payload, tuple)
                delivered, step = payload
                scheduled[delivered] = False
                follow_ups = self._deliver(delivered, step, driver, routed, result)
                for follow_up in itertools.chain(follow_ups, driver.released(now)):
                    if follow_up.arrival_time < now:
                        raise ValueError("a follow-up request cannot arrive in the past")
                    heapq.heappush(heap, (follow_up.arrival_time, _ARRIVAL, next(order), follow_up))
                schedule_step(delivered, step.end)
        return result

    def _deliver(
        self,
        pod: int,
        step: StepResult,
        driver: FleetDriver,
        routed: dict[SimRequest, int],
        result: FleetResult,
    ) -> list[TraceRequest]:
        now = step.end
        if step.events:
            driver.kv_events(pod, step.events, now)
        for req, _token in step.tokens:
            if len(req.output_token_ids) == 1:
                driver.first_token(req, pod, now)
        follow_ups: list[TraceRequest] = []
        for req in step.finished:
            result.records.append(_record(req, routed.pop(req)))
            follow_ups.extend(driver.finished(req, pod, now))
        return follow_ups

    def _admit(
        self,
        item: TraceRequest,
        driver: FleetDriver,
        routed: dict[SimRequest, int],
        result: FleetResult,
    ) -> int | None:
        now = item.arrival_time
        pod = driver.route(item, self, now)
        if pod is None:
            return None
        if not 0 <= pod < len(self.engines):
            raise ValueError(f"routing returned pod {pod} of {len(self.engines)}")
        known = driver.engine_block_hashes(item)
        try:
            req = self.engines[pod].add_request(
                item.request_id,
                list(item.prompt_token_ids),
                item.max_tokens,
                now,
                item.cache_salt,
                block_hashes=list(known) if known is not None else None,  # the engine extends it
                history=item.history if self.cache_ops else None,
            )
        except ValueError as exc:  # RequestRejected
            result.rejected.append(item.request_id)
            driver.rejected(item, pod, str(exc), now)
            return None
        routed[req] = pod
        return pod


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
