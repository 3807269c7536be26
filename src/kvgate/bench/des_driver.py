"""The discrete-event bench's router: kvgate's own routing core driven by simulated engines.

The fleet is :class:`kvgate.sim.des.DESFleet` (the simulator's engines in virtual time). The
router is :class:`kvgate.router.core.lifecycle.RoutingCore`, built from the config that
``kvgate router`` builds (``des_config.py``), with the simulated clock. What the live router
learns over the network, it learns here through the same code, driven by
:class:`RouterDriver`'s hooks:

- **arrival**: the body and headers the load generator sends (``prompt`` as token ids, so keys
  are exact; ``x-kvgate-class``, ``x-session-id``, the API key) go to ``core.admit``; a plan is
  sent at once (``core.sent`` counts it on the chosen pod). A request the router queues (flow
  control) arrives again when it is granted (``released``) and goes to ``core.dispatch``; one it
  refuses (4xx/5xx, a queue deadline's 429) never reaches a pod and is recorded with its status,
  as the load generator would record it. Its TTFT counts from its first arrival;
- **first token**: ``core.first_byte``; **end**: ``core.finished`` with the engine's usage
  (prompt, cached and completion tokens); a pod's 400 (prompt too long): ``core.finished`` with
  that status. A session's next turn arrives its think time after the answer;
- **KV events**: each step's events, encoded as vLLM encodes them, go through a
  :class:`kvgate.directory.subscriber.PodSubscriber` (the indexer's code) into the pool's memory
  directory;
- **load**: every ``load_metrics.scrape_interval_seconds`` each pod's ``/metrics`` as a scrape
  would read it (waiting, running, KV usage, KV cache size and tokens written) goes to
  ``core.load_scraped``;
- **scale-up** (``scale``: at time t, n more pods): the pods join the fleet with empty caches and
  the endpoint set, every replica's ``core.endpoints_changed`` hears of them, and the warm
  requests each core hands out go to their pods as each live router's warmer sends them
  (``des_warmup.py``). Warm requests are not client requests: they are left out of the records
  (and counted: ``DesResult.warm_requests``);
- **replicas** (``replicas`` > 1): that many routing cores over the one directory, exchanging
  loads (``des_replicas.py``); unless ``warmup.shared`` is false they share warm-ups (one claim
  per joining pod, hot-prefix counts exchanged), as ``http/warm_sharing.py`` does live.

No network latency and no router CPU time: TTFT is the engine's (arrival to first token). Each
request becomes a :class:`RequestRecord` in simulated seconds, so live and discrete-event runs
share the report code. Any policy of the scoring registry can run (``kvgate.bench.targets.kvgate_policies``); the
SGLang router is a separate binary and cannot be plugged in here.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq.asyncio

from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
from kvgate.bench.des_config import MODEL, des_router_config, pod_url
from kvgate.bench.des_replicas import DesReplicas
from kvgate.bench.des_warmup import DesWarmups
from kvgate.bench.loadgen import CLASS_HEADER, SESSION_HEADER
from kvgate.bench.records import LoadSample, RequestRecord
from kvgate.bench.workload import BenchRequest, Workload
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.subscriber import PodEndpoint, PodSubscriber
from kvgate.discovery.endpoints import EndpointSpec
from kvgate.discovery.endpoints import LoadSample as ScrapedLoad
from kvgate.kvevents import EventBatch, KVEvent, encode_batch
from kvgate.prefix.cache_ops import token_prompt_history
from kvgate.router.core.accounting import Attempt
from kvgate.router.core.admission import Waiter
from kvgate.router.core.errors import RouterError
from kvgate.router.core.learn import Usage
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.routing import RoutePlan
from kvgate.sim.des import DESFleet, FleetDriver, TraceRequest
from kvgate.sim.request import SimRequest

ProgressFn = Callable[[int], None]  # called with the number of finished requests

T = TypeVar("T")


@dataclass
class _InFlight:
    bench: BenchRequest
    record: RequestRecord
    request: ClientRequest
    plan: RoutePlan
    attempt: Attempt
    core: RoutingCore


class RouterDriver(FleetDriver):
    """The routing core of one simulated ``kvgate router`` process, or of several replicas (see
    the module docstring)."""

    def __init__(
        self,
        fleet: DESFleet,
        policy: str,
        *,
        seed: int = 0,
        policy_params: dict[str, Any] | None = None,
        sample_interval_s: float = 1.0,
        progress: ProgressFn | None = None,
        config_update: dict[str, Any] | None = None,
        pool_class: str = "online",
        cpu_offload: bool = False,
        scale: Sequence[tuple[float, int]] = (),
        warmup: WarmupConfig | None = None,
        replicas: int = 1,
        load_sharing: LoadSharingConfig | None = None,
    ) -> None:
        """The config arguments are :func:`des_router_config`'s. With ``fleet.cache_ops`` the
        bodies' `cache` fields reach the pods (the router keys them); with `cpu_offload` the
        engines' CPU-tier events are indexed and its hits priced (otherwise only GPU blocks
        count)."""
        self.fleet = fleet
        self.now = 0.0
        ids = list(fleet.names)  # the endpoints' directory ids
        config = des_router_config(
            fleet,
            policy,
            seed=seed,
            policy_params=policy_params,
            config_update=config_update,
            pool_class=pool_class,
            cpu_offload=cpu_offload,
            warmup=warmup,
        )
        # The one directory stands for the shared Redis: warm-ups are shared unless `shared`
        # is false.
        share_warmup = replicas > 1 and (warmup or config.warmup).sharing_active(
            shared_directory=True
        )
        self._cpu_offload = cpu_offload
        self.config = config
        pool = config.pools[0]
        self.index = MemoryBlockIndex()  # one directory, shared by the replicas (as Redis is)
        self.replicas = DesReplicas(
            config, replicas, self.index, self.clock, seed=seed, load_sharing=load_sharing
        )
        self._pool_key = pool.key
        self._specs: list[EndpointSpec] = []
        self._subscribers: list[PodSubscriber] = []
        self._seq: list[int] = []
        self._pod_index: dict[str, int] = {}
        # After the cores are built (a bad policy parameter raises there), so nothing is left open.
        self._zmq = zmq.asyncio.Context()  # replay sockets only; never used: no seq gaps here
        self._join(ids)
        self._scale = sorted(scale)
        self.warmups = DesWarmups(
            self.replicas.cores,
            self._pod_index,
            shared=share_warmup,
            clock=self.clock,
            complete=self._complete,
        )
        scrape = config.load_metrics.scrape_interval_seconds
        sharing = self.replicas.sharing
        self.tick_interval_s = min(scrape, sharing.interval_seconds) if sharing else scrape
        self._scrape_every = max(1, round(scrape / self.tick_interval_s))
        self._sample_every = max(1, round(sample_interval_s / self.tick_interval_s))
        self._ticks = 0
        self._bench: dict[str, tuple[BenchRequest, tuple[BenchRequest, ...], int]] = {}
        self._in_flight: dict[str, _InFlight] = {}
        # Requests in the router's queue: (record, request) by id; and those it let go.
        self._queued: dict[str, tuple[RequestRecord, ClientRequest, RoutingCore]] = {}
        self._decided: list[Waiter] = []
        self._granted: dict[str, Waiter] = {}
        self.records: list[RequestRecord] = []
        self.samples: list[LoadSample] = []
        self.decisions: list[tuple[str, str, str, int]] = []
        self._progress = progress
        self.peak_kv_usage = 0.0
        self._done = 0

    def clock(self) -> float:
        return self.now

    def _join(self, ids: list[str]) -> None:
        """Pods `ids` (already in the fleet) join the pool: endpoints, KV-event subscribers."""
        for pod_id in ids:
            url = pod_url(pod_id)
            spec = EndpointSpec(pod_id, self._pool_key, url, kv_events=f"inproc://{pod_id}")
            self._specs.append(spec)
            subscriber = PodSubscriber(
                PodEndpoint(pod_id, f"inproc://{pod_id}"),
                self.index,
                self._zmq,
                offload_tier=self._cpu_offload,
                block_size=self.config.pools[0].engine.block_size,
            )
            self._complete(subscriber.open())
            self._subscribers.append(subscriber)
            self._seq.append(0)
            self._pod_index[pod_id] = len(self._pod_index)
        self._complete(self.replicas.join(self._pool_key, self._specs, ids))

    def close(self) -> None:
        self._zmq.term()

    @staticmethod
    def _complete(coroutine: Coroutine[Any, Any, T]) -> T:
        """Run one of the core's coroutines to its end. With the memory directory they never
        wait on anything, so no event loop is needed (and a caller's running loop is no
        obstacle); one that does wait is an error here, not a silent stall. A bare yield
        (`asyncio.sleep(0)`: the KV-event subscriber's turn between two slices of a large
        batch) waits on nothing and is resumed at once."""
        try:
            while coroutine.send(None) is None:
                pass
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        coroutine.close()
        raise RuntimeError("a routing-core coroutine waited on I/O in the discrete-event bench")

    # -- the workload --------------------------------------------------------------------

    def trace(self, workload: Workload) -> list[TraceRequest]:
        """Open-loop requests and every session's first turn, in arrival order."""
        items: list[tuple[float, BenchRequest, tuple[BenchRequest, ...], int]] = [
            (r.arrival_s, r, (), 0) for r in workload.requests
        ]
        items += [(s.start_s, s.turns[0], s.turns, 0) for s in workload.sessions if s.turns]
        items.sort(key=lambda item: item[0])
        return [self._trace_request(at, bench, turns, turn) for at, bench, turns, turn in items]

    def _trace_request(
        self, at: float, bench: BenchRequest, turns: tuple[BenchRequest, ...], turn: int
    ) -> TraceRequest:
        self._bench[bench.request_id] = (bench, turns, turn)
        return _pod_request(bench, at)

    # -- hooks ---------------------------------------------------------------------------

    def route(self, request: TraceRequest, fleet: DESFleet, now: float) -> int | None:
        self.now = now
        warm_pod = self.warmups.pod_of(request.request_id)
        if warm_pod is not None:
            return warm_pod
        waiter = self._granted.pop(request.request_id, None)
        if waiter is not None:
            record, client, core = self._queued[request.request_id]
            try:
                plan = self._complete(core.dispatch(waiter))
            except RouterError as exc:
                del self._queued[request.request_id]
                self._refused(record, exc, now)
                return None
            if plan is None:  # back in the queue
                return None
            del self._queued[request.request_id]
            return self._send(self._bench[request.request_id][0], record, client, plan, core)
        bench = self._bench[request.request_id][0]
        record = RequestRecord(
            request_id=bench.request_id,
            request_class=bench.request_class,
            session_id=bench.session_id,
            scheduled_s=now,
            sent_s=now,
        )
        self.records.append(record)
        headers = {CLASS_HEADER: bench.request_class}
        if bench.session_id is not None:
            headers[SESSION_HEADER] = bench.session_id
        if bench.api_key is not None:
            headers["authorization"] = f"Bearer {bench.api_key}"
        body = {
            "model": MODEL,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": bench.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if "cache" in bench.body:
            body["cache"] = bench.body["cache"]
        client = ClientRequest(body, headers, "completion", request_id=bench.request_id)
        core = self.replicas.pick()
        try:
            admitted = self._complete(core.admit(client, self._on_decided))
        except RouterError as exc:
            self._refused(record, exc, now)
            return None
        if isinstance(admitted, Waiter):
            self._queued[bench.request_id] = (record, client, core)
            return None
        return self._send(bench, record, client, admitted, core)

    def _on_decided(self, waiter: Waiter) -> None:
        self._decided.append(waiter)

    def holding(self) -> bool:
        return bool(self._queued)

    def released(self, now: float) -> list[TraceRequest]:
        """Queued requests the core granted (they arrive again now) or refused (recorded)."""
        out: list[TraceRequest] = []
        decided, self._decided = self._decided, []
        for waiter in decided:
            request_id = waiter.request.request_id
            if waiter.error is None:
                self._granted[request_id] = waiter
                out.append(_pod_request(self._bench[request_id][0], now))
            else:
                record, _client, _core = self._queued.pop(request_id)
                self._refused(record, waiter.error, now)
        return out

    def _refused(self, record: RequestRecord, exc: RouterError, now: float) -> None:
        """The router refused the request: recorded, and its session ends there, as a live
        agent whose call failed stops (`loadgen.py`); the turns not sent are in the report."""
        record.status, record.error, record.end_s = exc.status, exc.message, now
        self._finish_one(record.request_id, now)

    def _send(
        self,
        bench: BenchRequest,
        record: RequestRecord,
        client: ClientRequest,
        plan: RoutePlan,
        core: RoutingCore,
    ) -> int:
        attempt = core.sent(client, plan, streaming=True)
        record.endpoint = plan.endpoint.id
        decision = plan.decision
        self.decisions.append(
            (bench.request_id, plan.endpoint.id, decision.reason, decision.predicted_hit_tokens)
        )
        self._in_flight[bench.request_id] = _InFlight(bench, record, client, plan, attempt, core)
        return self._pod_index[plan.endpoint.id]

    def rejected(self, request: TraceRequest, pod: int, error: str, now: float) -> None:
        self.now = now
        if self.warmups.pod_of(request.request_id) is not None:
            # the next tick sends what waits behind it (this hook cannot send)
            self.warmups.done(request.request_id, now, ok=False, prompt_tokens=0, send=False)
            return
        flight = self._in_flight.pop(request.request_id)
        flight.core.first_byte(flight.plan, flight.attempt, streamed=False)
        flight.core.finished(
            flight.request,
            flight.plan,
            flight.attempt,
            status=400,
            usage=None,
            completed=True,
            streamed=False,
        )
        record = flight.record
        record.status, record.error, record.end_s = 400, error, now
        self._finish_one(request.request_id, now)

    def first_token(self, request: SimRequest, pod: int, now: float) -> None:
        self.now = now
        if self.warmups.pod_of(request.request_id) is not None:
            return
        flight = self._in_flight[request.request_id]
        flight.record.first_byte_s = now
        flight.core.first_byte(flight.plan, flight.attempt, streamed=True)

    def finished(self, request: SimRequest, pod: int, now: float) -> list[TraceRequest]:
        self.now = now
        if self.warmups.pod_of(request.request_id) is not None:
            tokens = len(request.prompt_token_ids)
            return self.warmups.done(request.request_id, now, ok=True, prompt_tokens=tokens)
        flight = self._in_flight.pop(request.request_id)
        cached = max(request.num_cached_tokens, 0)
        completion = len(request.output_token_ids)
        flight.core.finished(
            flight.request,
            flight.plan,
            flight.attempt,
            status=200,
            usage=Usage(request.num_prompt_tokens, cached, completion),
            completed=True,
            streamed=True,
        )
        record = flight.record
        record.end_s, record.status = now, 200
        record.prompt_tokens, record.cached_tokens = request.num_prompt_tokens, cached
        record.completion_tokens = completion
        return self._finish_one(request.request_id, now)

    def _finish_one(self, request_id: str, now: float) -> list[TraceRequest]:
        self._done += 1
        if self._progress is not None:
            self._progress(self._done)
        bench, turns, turn = self._bench.pop(request_id)
        if turn + 1 >= len(turns):
            return []
        nxt = turns[turn + 1]
        return [self._trace_request(now + bench.think_time_s, nxt, turns, turn + 1)]

    def kv_events(self, pod: int, events: Sequence[KVEvent], now: float) -> None:
        self.now = now
        seq = self._seq[pod]
        self._seq[pod] = seq + 1
        frames = [b"", seq.to_bytes(8, "big"), encode_batch(EventBatch(now, list(events), 0))]
        self._complete(self._subscribers[pod].handle(frames))

    def tick(self, fleet: DESFleet, now: float) -> list[TraceRequest]:
        self.now = now
        joined = False
        while self._scale and self._scale[0][0] <= now:
            _, count = self._scale.pop(0)
            first = len(fleet.engines)
            ids = [f"pod-{first + i}" for i in range(count)]
            for pod_id in ids:
                fleet.add_pod(pod_id)
            self._join(ids)
            joined = True
        added = self.warmups.tick(now, joined=joined)
        sample = self._ticks % self._sample_every == 0
        scrape = self._ticks % self._scrape_every == 0
        self._ticks += 1
        if self.replicas.sharing is not None:
            self.replicas.exchange_loads([spec.id for spec in self._specs], now)
        if not scrape and not sample:
            return added
        for index, engine in enumerate(fleet.engines):
            stats = engine.stats
            load = ScrapedLoad(
                waiting=float(engine.num_waiting),
                running=float(engine.num_running),
                kv_cache_usage=engine.kv_cache.usage,
                scraped_at=now,
                kv_capacity_tokens=engine.num_gpu_blocks * engine.config.block_size,
                kv_written_tokens=float(
                    stats.prefix_cache_queries - stats.prefix_cache_hits + stats.generation_tokens
                ),
            )
            if scrape:
                self.peak_kv_usage = max(self.peak_kv_usage, load.kv_cache_usage)
                self.replicas.scraped(index, load)
            if sample:
                self.samples.append(LoadSample(now, fleet.names[index], load.running, load.waiting))
        return added


def _pod_request(bench: BenchRequest, at: float) -> TraceRequest:
    """The request as a simulated pod receives it at `at`: its tokens and, when the body has a
    `cache` field, the op history a pod with --sim-akv makes of it (also when it was queued)."""
    cache = bench.body.get("cache")
    history = None if cache is None else token_prompt_history(cache, len(bench.prefix_units))
    return TraceRequest(
        bench.request_id,
        at,
        bench.prefix_units,
        bench.max_tokens,
        None,
        bench.session_id,
        history,
    )
