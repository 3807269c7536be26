"""Discrete-event benchmark: the simulator's engines, kvgate's scoring policies, no HTTP.

Every pod is a :class:`kvgate.sim.engine.SimEngine` (the same KV cache, scheduler and
performance profile as ``kvgate sim``), stepped in simulated time. Events, in time order:

- **arrival** (open-loop ``arrival_s``, or a session's next turn at the previous turn's finish +
  think time): the routing plug-in builds what the live router would see and calls the scoring
  policy (:func:`kvgate.scoring.registry.build_policy`) *unchanged*:
  ``RoutingRequest`` (prompt tokens and vLLM block hashes), ``matched_blocks`` from an index of
  the engines' own KV events (what kvgate's directory holds, without network lag), one ``EndpointSnapshot`` per
  pod (requests in flight and pending prefill from this router's own accounting; engine waiting /
  running / KV usage as a fresh ``/metrics`` scrape would report them; the prefill rate learned
  from TTFTs like the live router's estimator), the clock, a seeded RNG and the choice history.
  The request is added to the chosen engine with its arrival time;
- **step** of one pod: ``engine.step(t)``; first tokens and finished requests are recorded
  (TTFT = first token - arrival, as the engine's own histogram measures it), and the next step is
  scheduled at the step's end, or when the next request arrives at an idle pod.

Each request becomes a :class:`RequestRecord` in simulated seconds, so live and discrete-event
runs share the report code. The SGLang router is a separate binary and cannot be plugged in here.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvgate.bench.records import GeneratorHealth, LoadSample, RequestRecord
from kvgate.bench.report import BenchReport, arrival_order, ideal_hit_rate, summarize
from kvgate.bench.workload import BenchRequest, Workload
from kvgate.scoring.base import (
    ChoiceHistory,
    EndpointSnapshot,
    EngineLoad,
    Policy,
    RoutingRequest,
)
from kvgate.scoring.prefill_rate import PrefillRateEstimator
from kvgate.scoring.registry import build_policy
from kvgate.sim.engine import EngineConfig, SimEngine
from kvgate.sim.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import DEFAULT_PROFILE, load_profile
from kvgate.sim.request import SimRequest

MODEL = "sim-model"
POOL = "default/default"
DES_POLICIES = ("round-robin", "least-load", "prefix", "kvgate")

ProgressFn = Callable[[int], None]  # called with the number of finished requests


@dataclass
class _Pod:
    id: str
    engine: SimEngine
    step_scheduled: bool = False
    in_flight: int = 0
    pending_requests: int = 0
    pending_tokens: int = 0


@dataclass
class _Pending:
    bench: BenchRequest
    pod: _Pod
    record: RequestRecord
    predicted_uncached: int
    queued_ahead: int
    sim: SimRequest | None = None
    session: tuple[BenchRequest, ...] = ()
    turn: int = 0


@dataclass(frozen=True)
class _Arrival:
    bench: BenchRequest
    session: tuple[BenchRequest, ...] = ()  # the session's turns (closed loop), else empty
    turn: int = 0


@dataclass
class DesResult:
    records: list[RequestRecord]
    samples: list[LoadSample]
    health: GeneratorHealth = field(default_factory=GeneratorHealth)


class DesFleet:
    """``pods`` simulated engines routed by one scoring policy."""

    def __init__(
        self,
        pods: int,
        policy: str,
        *,
        profile: str = DEFAULT_PROFILE,
        engine: EngineConfig | None = None,
        seed: int = 0,
        sample_interval_s: float = 1.0,
        policy_params: dict[str, Any] | None = None,
    ) -> None:
        if policy not in DES_POLICIES:
            raise ValueError(
                f"policy {policy!r} cannot run in des mode ({', '.join(DES_POLICIES)})"
            )
        self.config = engine or EngineConfig()
        perf = load_profile(profile)
        self.hasher = PrefixBlockHasher("sha256", self.config.block_size, None)
        self.pods = [
            _Pod(f"pod-{i}", SimEngine(self._pod_config(i), perf, self.hasher)) for i in range(pods)
        ]
        self.policy: Policy = build_policy(policy, policy_params)
        self.rng = random.Random(seed)
        self.history = ChoiceHistory()
        self.estimator = PrefillRateEstimator()
        self.sample_interval_s = sample_interval_s
        self._events: list[tuple[float, int, _Arrival | _Pod]] = []
        # block hash -> pods holding it, kept from the engines' KV events (the directory)
        self._holders: dict[object, set[str]] = {}
        self._order = itertools.count()

    def _pod_config(self, index: int) -> EngineConfig:
        c = self.config
        return EngineConfig(**{**c.__dict__, "seed": c.seed + index})

    def _push(self, at: float, payload: _Arrival | _Pod) -> None:
        heapq.heappush(self._events, (at, next(self._order), payload))

    # -- routing plug-in ---------------------------------------------------------------------

    def _snapshot(self, pod: _Pod, now: float) -> EndpointSnapshot:
        engine = pod.engine
        return EndpointSnapshot(
            id=pod.id,
            pool=POOL,
            in_flight=pod.in_flight,
            pending_prefill_requests=pod.pending_requests,
            pending_prefill_tokens=pod.pending_tokens,
            engine=EngineLoad(
                waiting=engine.num_waiting,
                running=engine.num_running,
                kv_cache_usage=engine.kv_cache.usage,
                observed_at=now,
            ),
            prefill_tokens_per_second=self.estimator.rate(pod.id),
            max_num_seqs=self.config.max_num_seqs,
        )

    def route(self, tokens: list[int], now: float) -> tuple[_Pod, int]:
        """Choose a pod; returns it and the predicted uncached prompt tokens."""
        keys = self.hasher.prompt_hashes(tokens, None)
        request = RoutingRequest(
            model=MODEL,
            prompt_tokens=len(tokens),
            block_tokens=self.config.block_size,
            block_keys=keys,
        )
        matched = self.matched_blocks(keys)
        snapshots = [self._snapshot(pod, now) for pod in self.pods]
        decision = self.policy.decide(
            request, snapshots, matched, now=now, rng=self.rng, history=self.history
        )
        self.history.record(decision.endpoint_id)
        pod = next(p for p in self.pods if p.id == decision.endpoint_id)
        return pod, max(0, len(tokens) - decision.predicted_hit_tokens)

    def matched_blocks(self, keys: list[bytes]) -> dict[str, int]:
        """Pod -> leading blocks of ``keys`` it holds, from the KV-event index."""
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        for index, key in enumerate(keys):
            holders = self._holders.get(key)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for pod_id in alive:
                matched[pod_id] = index + 1
        return matched

    def _apply_events(self, pod: _Pod, events: list[KVEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                for h in event.block_hashes:
                    self._holders.setdefault(h, set()).add(pod.id)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    holders = self._holders.get(h)
                    if holders is not None:
                        holders.discard(pod.id)
                        if not holders:
                            del self._holders[h]
            elif isinstance(event, AllBlocksCleared):
                held = [key for key, pods in self._holders.items() if pod.id in pods]
                for key in held:
                    self._holders[key].discard(pod.id)
                    if not self._holders[key]:
                        del self._holders[key]

    # -- event loop --------------------------------------------------------------------------

    def run(self, workload: Workload, progress: ProgressFn | None = None) -> DesResult:
        for request in workload.requests:
            self._push(request.arrival_s, _Arrival(request))
        for session in workload.sessions:
            if session.turns:
                self._push(session.start_s, _Arrival(session.turns[0], session.turns, 0))
        by_request: dict[str, _Pending] = {}
        records: list[RequestRecord] = []
        samples: list[LoadSample] = []
        next_sample = 0.0
        done = 0
        while self._events:
            now, _, payload = heapq.heappop(self._events)
            while now >= next_sample:
                samples.extend(self._sample(next_sample))
                next_sample += self.sample_interval_s
            if isinstance(payload, _Arrival):
                pending = self._arrive(payload.bench, now)
                pending.session, pending.turn = payload.session, payload.turn
                by_request[payload.bench.request_id] = pending
                records.append(pending.record)
                continue
            for finished in self._step(payload, now, by_request):
                done += 1
                if progress is not None:
                    progress(done)
                nxt = finished.turn + 1
                if nxt < len(finished.session):
                    at = (finished.record.end_s or now) + finished.bench.think_time_s
                    self._push(at, _Arrival(finished.session[nxt], finished.session, nxt))
        return DesResult(records=records, samples=samples)

    def _arrive(self, bench: BenchRequest, now: float) -> _Pending:
        tokens = list(bench.prefix_units)
        pod, uncached = self.route(tokens, now)
        record = RequestRecord(
            request_id=bench.request_id,
            request_class=bench.request_class,
            session_id=bench.session_id,
            scheduled_s=now,
            sent_s=now,
            endpoint=pod.id,
        )
        pending = _Pending(bench, pod, record, uncached, queued_ahead=pod.in_flight)
        try:
            pending.sim = pod.engine.add_request(bench.request_id, tokens, bench.max_tokens, now)
        except ValueError as exc:  # RequestRejected: what a pod answers with a 400
            record.status, record.error, record.end_s = 400, str(exc), now
            return pending
        pod.in_flight += 1
        pod.pending_requests += 1
        pod.pending_tokens += uncached
        if not pod.step_scheduled:
            pod.step_scheduled = True
            self._push(now, pod)
        return pending

    def _step(self, pod: _Pod, now: float, by_request: dict[str, _Pending]) -> list[_Pending]:
        engine = pod.engine
        result = engine.step(now)
        self._apply_events(pod, result.events)
        finished: list[_Pending] = []
        for sim, _token in result.tokens:
            pending = by_request[sim.request_id]
            record = pending.record
            if record.first_byte_s is None:
                record.first_byte_s = sim.first_token_time
                pod.pending_requests -= 1
                pod.pending_tokens -= pending.predicted_uncached
                cached = max(sim.num_cached_tokens, 0)
                self.estimator.observe_ttft(
                    pod.id,
                    sim.num_prompt_tokens - cached,
                    (sim.first_token_time or now) - sim.arrival_time,
                    pending.queued_ahead,
                )
        for sim in result.finished:
            pending = by_request.pop(sim.request_id)
            record = pending.record
            record.end_s = sim.finish_time
            record.status = 200
            record.prompt_tokens = sim.num_prompt_tokens
            record.cached_tokens = max(sim.num_cached_tokens, 0)
            record.completion_tokens = len(sim.output_token_ids)
            pod.in_flight -= 1
            finished.append(pending)
        nxt = engine.next_step_time(result.end)
        if nxt is None:
            pod.step_scheduled = False
        else:
            self._push(nxt, pod)
        return finished

    def _sample(self, at: float) -> list[LoadSample]:
        return [
            LoadSample(
                t_s=at,
                pod=pod.id,
                running=float(pod.engine.num_running),
                waiting=float(pod.engine.num_waiting),
            )
            for pod in self.pods
        ]


def run_des(
    workload: Workload,
    policy: str,
    pods: int,
    *,
    seed: int = 0,
    profile: str = DEFAULT_PROFILE,
    progress: ProgressFn | None = None,
    policy_params: dict[str, Any] | None = None,
) -> DesResult:
    """One policy over one workload on ``pods`` simulated engines."""
    fleet = DesFleet(pods, policy, profile=profile, seed=seed, policy_params=policy_params)
    return fleet.run(workload, progress)


def des_report(
    workload: Workload,
    pods: int,
    targets: list[str],
    *,
    seed: int = 0,
    block_size: int = 16,
    on_target: Callable[[str], ProgressFn] | None = None,
    policy_params: dict[str, Any] | None = None,
) -> tuple[BenchReport, dict[str, list[RequestRecord]], dict[str, list[LoadSample]]]:
    """Run every target that can run in des mode; the others are named in the report's notes."""
    summaries = {}
    records: dict[str, list[RequestRecord]] = {}
    samples: dict[str, list[LoadSample]] = {}
    notes = []
    for name in targets:
        if name not in DES_POLICIES:
            notes.append(f"{name} is not a kvgate scoring policy and cannot run in des mode")
            continue
        progress = on_target(name) if on_target is not None else None
        params = policy_params if name == "kvgate" else None
        result = run_des(workload, name, pods, seed=seed, progress=progress, policy_params=params)
        records[name] = result.records
        samples[name] = result.samples
        summary = summarize(name, result.records)
        # in simulated time the client's TTFT is the engine's own
        summary.engine = {"ttft_mean_s": summary.ttft_mean_s}
        summaries[name] = summary
    first = next(iter(records.values()), [])
    order = arrival_order(workload.all_requests(), first)
    report = BenchReport(
        workload=workload.name,
        description=workload.description,
        pods=pods,
        ideal_hit_rate=ideal_hit_rate(order, block_size),
        targets=summaries,
        settings={
            "mode": "des",
            "targets": targets,
            "seed": seed,
            "workload_params": workload.params,
        },
        notes=notes,
    )
    return report, records, samples
