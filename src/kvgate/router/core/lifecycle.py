"""The routing core: one owner for a request's lifecycle, from its decision to what is learned.

    admit ──> plan ──> sent ──> first_byte ──> finished
      │        ^         ├──> failed ──> plan again without the endpoints tried (the caller retries)
      │        │         └──> cancelled (the client left)
      └──> queued ──> granted ──> plan over the pods with room (`dispatch`)
                 └──> refused (deadline: 429) or cancelled (the client left)
     explain (the same decision, recorded nowhere: /debug/route)

- `admit(request, on_done)`: plan at once when a pod the request may use has room, else queue it
  (`admission.py`: flow control); `route` is admit + wait + dispatch for the live router.

- `plan(request, exclude)`: classify, key, look up the directory and decide (`routing.Router`).
  A decision that will be acted on is recorded: the choice history, the routing history of pods
  without KV events (before the request is sent, so the next request of a burst already sees
  where this one went), the session's prefix-break check (first try only), the retry counter.
- `sent(plan, streaming)`: the request is counted on its endpoint (`accounting.py`).
- `first_byte(attempt)`: a stream's prefill is over.
- `finished(attempt, ...)`: the attempt ends; metrics and prefill-rate learning (`learn.py`); a
  complete answer is a passive health success (the pod's failures in a row start again from 0).
- `failed(attempt, kind)`: the endpoint failed before the first byte: a passive health failure
  (enough in a row eject it for a while), counted; the caller may plan again.
- `broke(plan, kind)`: a stream broke after its first byte: a passive health failure as well (a
  pod that starts every answer and breaks it must leave rotation as one that fails at once);
  never retried (output was sent); `finished` follows.
- `cancelled(attempt)`: the client went away; nothing is learned, nothing counts against the pod.
- `load_scraped` / `scrape_failed`: the load scraper's findings (engine load, active health).
- `peers.update(...)`: the other router replicas' load on each pod (`peer_load.py`), added to
  this replica's own counts in every decision while it is fresh.
- `endpoints_changed(added, removed)`: forget what departed endpoints left behind; a pod that
  joins a pool with other pods is warmed with the pool's hottest prefixes before it takes its
  full share (`warmup.py`; the I/O side sends what `warmup.take()` hands it and, with router
  replicas sharing warm-ups, claims and follows them through the directory).
- `pool_removed(pool)`: a reload dropped the pool: forget the warm-up state it left behind.

Only `admit`, `route`, `dispatch`, `plan` and `explain` await anything (the directory: a Redis round trip with the redis
backend); every hook is plain synchronous code. Time comes from the injected clock: monotonic in
the live router, simulated in the discrete-event benchmark, which drives this same class
(`kvgate.bench.des`), so every benchmark number measures the router users run. The HTTP app and
the proxy (`kvgate.router.http`) are I/O around these hooks; nothing else mutates endpoint state.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from kvgate.directory.base import BlockIndex
from kvgate.discovery.endpoints import Endpoint, EndpointSet, LoadSample, every_one_ejected
from kvgate.router.core.accounting import Accounting, Attempt
from kvgate.router.core.admission import (
    MISS_COST_FACTOR,
    FlowControl,
    Waiter,
    pinned_to_leaving_pod,
)
from kvgate.router.core.classify import Classification
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keys import RequestKeys
from kvgate.router.core.learn import Learner, Outcome, Usage
from kvgate.router.core.peer_load import PeerLoads
from kvgate.router.core.prefix_copies import PrefixCopies
from kvgate.router.core.routing import RoutePlan, Router, RouterState
from kvgate.router.core.sessions import SessionTracker
from kvgate.router.core.warmup import Warmup
from kvgate.router.metrics import RouterMetrics
from kvgate.scoring.base import Decision, PrefixCopy
from kvgate.scoring.output_length import OutputLengthEstimator
from kvgate.scoring.prefill_rate import PrefillRateEstimator

log = logging.getLogger(__name__)

OVERDUE_FACTOR = 4.0  # a stream with no first byte after this x its predicted TTFT...
OVERDUE_MIN_SECONDS = 2.0  # ...and at least this long is overdue (`RoutingCore.cancelled`)


def overdue_seconds(decision: Decision) -> float:
    """How long a stream may wait for its first byte before a client giving up on it counts
    against the pod: a healthy pod breaks its streak with every answer it completes between
    such cancellations, a hung one with none."""
    return max(OVERDUE_MIN_SECONDS, OVERDUE_FACTOR * decision.predicted_ttft_seconds)


@dataclass(slots=True)
class ClientRequest:
    """One client request as the core sees it. Classification and keys are computed by the first
    `plan` (unless the caller classified it already, as the admin API does for a tenant) and
    reused by retries."""

    body: Mapping[str, Any]
    headers: Mapping[str, str]  # lower-case names
    kind: str  # "chat" | "completion"
    body_bytes: int = 0
    request_id: str = ""
    classification: Classification | None = None
    keys_by_pool: dict[str, RequestKeys] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)  # endpoint ids, in order


class RoutingCore:
    """One per router process (or per simulated router). Not thread-safe: one event loop."""

    def __init__(
        self,
        state: RouterState,
        endpoints: EndpointSet,
        indexes: Mapping[str, BlockIndex],
        metrics: RouterMetrics,
        directory_errors: Counter,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        config = state.config
        self.clock = clock
        self.metrics = metrics
        self.endpoints = endpoints
        self.accounting = Accounting()
        self.estimator = PrefillRateEstimator()
        self.output_lengths = OutputLengthEstimator()
        # a copy that ends frees its pod's prefill room: queued requests may go
        self.copies = PrefixCopies(self.accounting, metrics, on_done=lambda: self.flow.pump())
        self.warmup = Warmup(
            config.warmup, metrics, self.copies, shared=config.warmup_sharing_enabled
        )
        # Called when warm requests wait to be sent (a copy was queued); the live router sets
        # its warmer's `dispatch`, the discrete-event bench takes them at its next tick.
        self.warm_requests_ready: Callable[[], None] = lambda: None
        self.peers = PeerLoads(config.load_sharing.ttl_seconds)
        self.router = Router(
            state,
            endpoints,
            indexes,
            accounting=self.accounting,
            estimator=self.estimator,
            output_lengths=self.output_lengths,
            rng=rng,
            clock=clock,
            admits=self.warmup.admits,
            peers=self.peers,
            batch_waiting=lambda pool: self.flow.batch_waiting(pool),
        )
        self.learner = Learner(
            metrics,
            self.estimator,
            self.output_lengths,
            indexes,
            directory_errors,
            approximate_ttl_seconds=config.directory.approximate_ttl_seconds,
            access_log=config.server.access_log,
        )
        self.sessions = SessionTracker(
            metrics,
            config.sessions.max_sessions,
            config.sessions.ttl_seconds,
            max_bytes=config.sessions.max_state_bytes,
            clock=clock,
        )
        self.flow = FlowControl(config, self.router.candidates, self.accounting, metrics, clock)

    @property
    def state(self) -> RouterState:
        return self.router.state

    def reconfigure(self, state: RouterState) -> None:
        """A new configuration (reload); requests in flight keep the plans they have."""
        config = state.config
        self.router.state = state
        self.output_lengths.retain({pool.key for pool in config.pools})
        self.learner.ttl = config.directory.approximate_ttl_seconds
        self.learner.access_log = config.server.access_log
        self.warmup.configure(config.warmup, shared=config.warmup_sharing_enabled)
        self.peers.ttl_seconds = config.load_sharing.ttl_seconds
        self.sessions.configure(
            config.sessions.max_sessions,
            config.sessions.ttl_seconds,
            max_bytes=config.sessions.max_state_bytes,
        )
        self.flow.configure(config)
        self.flow.pump()

    # -- admission -------------------------------------------------------------------------

    async def route(self, request: ClientRequest) -> RoutePlan:
        """The live router's path: `admit`, and while queued wait for the grant (until the
        deadline: then RouterError 429); a cancellation (the client left) leaves the queue."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_waiter: Waiter) -> None:
            if not granted.done():
                granted.set_result(None)

        admitted = await self.admit(request, done)
        if isinstance(admitted, RoutePlan):
            return admitted
        waiter = admitted
        while True:
            try:
                async with asyncio.timeout(max(0.0, waiter.deadline_at - self.clock())):
                    await granted
            except TimeoutError:
                self.flow.expire(waiter)
            except BaseException:
                self.flow.cancel(waiter)
                raise
            if waiter.error is not None:
                raise waiter.error
            plan = await self.dispatch(waiter)
            if plan is not None:
                return plan
            granted = asyncio.get_running_loop().create_future()  # back in the queue

    async def admit(
        self, request: ClientRequest, on_done: Callable[[Waiter], None]
    ) -> RoutePlan | Waiter:
        """The plan, when a pod the request may use has room (or flow control is off, or no
        pod serves it at all: RouterError 503); else the request's place in the queue, and
        `on_done(waiter)` follows: granted (then call `dispatch`) or refused (`waiter.error`).
        Raises RouterError (4xx; 429 when the queue is full or the deadline cannot be met)."""
        flow = self.flow
        if not flow.enabled:
            return await self.plan(request)
        cls = request.classification
        if cls is None:
            cls = self.state.classifier.classify(request.body, request.headers, request.kind)
            request.classification = cls
        now = self.clock()
        flow.shares.seen(cls.tenant or "", now)
        candidates = self.router.candidates(cls, now)
        usable = flow.usable(cls, candidates, now)
        if (
            pinned_to_leaving_pod(cls, candidates)
            or flow.any_room(usable, now, fail_open=every_one_ejected(candidates, now))
            or not self.router.serves(cls)
        ):
            beyond_share: tuple[str, ...] = ()
            if usable is not candidates:  # hot path: usually no share applies
                mine = {ep.id for ep in usable}
                beyond_share = tuple(ep.id for ep in candidates if ep.id not in mine)
            plan = await self.plan(request, exclude=beyond_share)
            flow.admitted_at_once(plan.pool.key, cls.request_class)
            return plan
        # Every pod it may use is saturated: what it would hit where decides where it waits.
        hits: dict[str, int] = {}
        hold_seconds = 0.0
        prefill_seconds = 0.0
        rate = 0.0
        keys: RequestKeys | None = None
        if candidates:
            try:
                explained = await self.router.plan(
                    request.body,
                    request.headers,
                    request.kind,
                    classification=cls,
                    keys_by_pool=request.keys_by_pool,
                    record=False,
                    body_bytes=request.body_bytes,
                )
            except RouterError as err:
                if err.status != 503:
                    raise
            else:
                keys = explained.keys
                best = min(
                    (line.estimate for line in explained.decision.candidates),
                    key=lambda e: e.prefill_seconds,
                    default=None,
                )
                if best is not None:
                    prefill_seconds, rate = best.prefill_seconds, best.prefill_tokens_per_second
                for line in explained.decision.candidates:
                    e = line.estimate
                    hits[e.endpoint_id] = e.hit_tokens
                    if e.hit_tokens > 0 and e.prefill_tokens_per_second > 0:
                        saved = e.hit_tokens / e.prefill_tokens_per_second
                        hold_seconds = max(hold_seconds, MISS_COST_FACTOR * saved)
        if keys is None:
            keys = await self.router.prompt_keys(
                cls, request.body, request.kind, request.keys_by_pool, request.body_bytes
            )
        return flow.enqueue(
            request,
            cls,
            prompt_tokens=keys.prompt_tokens,
            hits=hits,
            hold_seconds=hold_seconds,
            prefill_seconds=prefill_seconds,
            on_done=on_done,
            keys=keys,
            prefill_tokens_per_second=rate,
        )

    async def dispatch(self, waiter: Waiter) -> RoutePlan | None:
        """Plan a granted waiter over the pods that have room now (every candidate if none
        has: it was granted a slot); its reserved slot is then free (the caller sends it).
        None: no pod it may use is left (batch borrowing ended since the grant); it is back in
        its place in the queue and `on_done` follows again."""
        now = self.clock()
        cls = waiter.classification
        candidates = self.router.candidates(cls, now)
        if not candidates and self.router.serves(cls):
            self.flow.requeue(waiter)
            return None
        usable = {ep.id for ep in self.flow.usable(cls, candidates, now)}
        fail_open = every_one_ejected(candidates, now)
        full = tuple(
            ep.id
            for ep in candidates
            if ep.id != waiter.granted_to
            and (ep.id not in usable or self.flow.slots(ep, now, fail_open=fail_open) <= 0)
        )
        try:
            return await self.plan(
                waiter.request, exclude=full if len(full) < len(candidates) else ()
            )
        finally:
            self.flow.release(waiter)

    # -- decisions -------------------------------------------------------------------------

    async def plan(self, request: ClientRequest, *, exclude: tuple[str, ...] = ()) -> RoutePlan:
        """The decision the caller will act on. Raises RouterError (client mistakes: 4xx; no
        endpoint: 503)."""
        first_try = not request.tried
        plan = await self.router.plan(
            request.body,
            request.headers,
            request.kind,
            exclude=exclude or tuple(request.tried),
            classification=request.classification,
            keys_by_pool=request.keys_by_pool,
            body_bytes=request.body_bytes,
        )
        request.classification = plan.classification
        if not first_try:
            self.metrics.child(self.metrics.retries, plan.pool.key).inc()
        await self.learner.routed(plan, share_in_flight=self._shares_in_flight_blocks())
        if first_try and plan.decision.copy is not None:
            await self._copy(plan, plan.decision.copy)
        if first_try:
            self.warmup.hot.observe(plan, self.clock())
            # A Responses follow-up sends only its new items: its keys never extend the turn
            # before, which is no prefix break.
            cls = plan.classification
            if cls.session_id is not None and cls.pinned_tag is None:
                await self.sessions.observe(plan, request.body, request.body_bytes)
        return plan

    async def _copy(self, plan: RoutePlan, copy: PrefixCopy) -> None:
        """Start the copy of the prefix the decision proposes, if it may start."""
        target = self.endpoints.get(copy.endpoint_id)
        if target is None:  # it left while the decision was made
            return
        blocks = self.copies.start(plan, copy, self.clock())
        if not blocks:
            return
        try:
            await self.learner.copied(
                plan, target, blocks, share_in_flight=self._shares_in_flight_blocks()
            )
        finally:  # queued and counted on its pod: it is sent even if this request is cancelled
            self.warm_requests_ready()

    def _shares_in_flight_blocks(self) -> bool:
        """Other replicas route to the same pods and the policy counts blocks in flight: they
        learn this replica's from the directory (`Learner.routed`)."""
        return (
            self.state.policy.counts_inflight_blocks
            and self.peers.replicas > 0
            and self.peers.fresh(self.clock())
        )

    async def explain(self, request: ClientRequest) -> RoutePlan:
        """The decision `plan` would make now, recorded nowhere."""
        return await self.router.plan(
            request.body,
            request.headers,
            request.kind,
            classification=request.classification,
            keys_by_pool=request.keys_by_pool,
            record=False,
            body_bytes=request.body_bytes,
        )

    # -- hooks -----------------------------------------------------------------------------

    def sent(self, request: ClientRequest, plan: RoutePlan, *, streaming: bool) -> Attempt:
        endpoint_id = plan.endpoint.spec.id
        request.tried.append(endpoint_id)
        adapter = plan.pool.lora_for(plan.classification.model)
        if adapter is not None:
            plan.endpoint.note_lora_adapters([adapter.name])
        attempt = self.accounting.sent(
            endpoint_id,
            self.clock(),
            uncached_tokens=plan.uncached_tokens,
            predicted_ttft_seconds=plan.decision.predicted_ttft_seconds,
            streaming=streaming,
            batch=plan.classification.request_class == "batch",
            # Requests with drops keep other blocks than their path: left to the directory.
            block_keys=plan.keys.block_keys if plan.keys.lookup is None else (),
        )
        self.metrics.child(self.metrics.inflight, plan.pool.key, endpoint_id).inc()
        if self.flow.enabled:
            tenant = plan.classification.tenant or ""
            self.flow.shares.started(attempt, tenant, endpoint_id, plan.uncached_tokens)
        return attempt

    def first_byte(self, plan: RoutePlan, attempt: Attempt, *, streamed: bool) -> None:
        """The endpoint answered. `streamed`: the answer is an event stream (its first byte
        follows the prefill); otherwise it is whole, and its prefill is over too."""
        attempt.first_byte_at = plan.endpoint.first_byte_at = self.clock()
        if streamed or not attempt.streaming:
            self.accounting.prefill_done(attempt)
            self.flow.pump()

    def finished(
        self,
        request: ClientRequest,
        plan: RoutePlan,
        attempt: Attempt,
        *,
        status: int,
        usage: Usage | None,
        completed: bool,
        streamed: bool,
    ) -> Outcome:
        """The attempt ended with an answer (whole, or a stream that broke after its start:
        `completed` False, and `broke` counted the failure). Only a complete answer is a health
        success: counted at the first byte, a pod that starts every answer and then breaks it
        would never have two failures in a row."""
        self._close(plan, attempt)
        if completed:
            plan.endpoint.answers.succeeded()
        now = self.clock()
        first = attempt.first_byte_at
        outcome = Outcome(
            plan=plan,
            status=status,
            ttft_seconds=first - attempt.sent_at if streamed and first is not None else None,
            duration_seconds=now - attempt.sent_at,
            usage=usage,
            retries=len(request.tried) - 1,
            queued_ahead=attempt.queued_ahead,
            completed=completed,
        )
        self.learner.finished(outcome, request.request_id)
        return outcome

    def failed(self, plan: RoutePlan, attempt: Attempt, kind: str) -> None:
        """The endpoint failed before the first byte (connect, timeout, 5xx, broken)."""
        self._close(plan, attempt)
        self._answer_failed(plan, kind)

    def unserved(self, plan: RoutePlan, attempt: Attempt, kind: str) -> None:
        """The endpoint answered, before any byte reached the client, that it cannot serve
        this request (a LoRA adapter it has not loaded): counted, and no failure of the pod."""
        self._close(plan, attempt)
        self.metrics.child(
            self.metrics.upstream_errors, plan.pool.key, plan.endpoint.id, kind
        ).inc()
        plan.endpoint.lacks_lora_adapter(plan.classification.model)  # priced as not loaded

    def broke(self, plan: RoutePlan, kind: str) -> None:
        """A stream broke after its first byte (too late to retry; `finished` follows)."""
        self._answer_failed(plan, kind)

    def _answer_failed(self, plan: RoutePlan, kind: str) -> None:
        ep = plan.endpoint
        self.metrics.child(self.metrics.upstream_errors, plan.pool.key, ep.id, kind).inc()
        limits = self.state.config.limits
        if ep.answers.failed(self.clock(), limits.eject_after_failures, limits.eject_seconds):
            log.warning("endpoint %s ejected after repeated failures", ep.id)

    def cancelled(self, plan: RoutePlan, attempt: Attempt) -> None:
        """The client went away (or the request was abandoned): nothing to learn, but for a
        stream it gave up on with no first byte long past its predicted TTFT (`overdue`)
        while the pod gave no request a first byte since it was sent: that counts as a
        failure of the pod. A hung engine answers its headers and /metrics but no token;
        clients that time out before `first_byte_timeout_seconds` left no trace, and each
        freed its slot for the next request to hang there. A busy pod's first bytes to others
        keep it out of this (several clients giving up at once, or the router's shutdown)."""
        overdue = (
            attempt.open
            and attempt.streaming
            and attempt.first_byte_at is None
            and plan.endpoint.first_byte_at < attempt.sent_at
            and self.clock() - attempt.sent_at >= overdue_seconds(plan.decision)
        )
        self._close(plan, attempt)
        if overdue:
            self._answer_failed(plan, "overdue")

    def _close(self, plan: RoutePlan, attempt: Attempt) -> None:
        if attempt.open:
            self.accounting.done(attempt)
            self.metrics.child(self.metrics.inflight, plan.pool.key, attempt.endpoint_id).dec()
            self.flow.shares.ended(attempt)
            self.flow.pump()

    # -- load and membership ---------------------------------------------------------------

    def load_scraped(self, ep: Endpoint, sample: LoadSample) -> None:
        """A fresh /metrics scrape: engine load, and active health: an endpoint ejected for
        failed scrapes is back in rotation. One ejected for failed answers stays out its time:
        /metrics answering says nothing of whether its answers do."""
        now = self.clock()
        ep.load = sample
        ep.pending_at_scrape = self.router.pending_prefill_requests(ep.id, now)
        ep.note_lora_adapters(sorted(sample.running_lora_adapters))
        was_healthy = ep.healthy(now)
        ep.scrapes.recovered()
        if not was_healthy and ep.healthy(now):
            log.info("endpoint %s answers /metrics again; back in rotation", ep.id)
        self.flow.pump()

    def scrape_failed(self, ep: Endpoint, reason: object) -> None:
        self.metrics.child(self.metrics.scrape_errors, ep.pool, ep.id).inc()
        limits = self.state.config.limits
        if ep.scrapes.failed(self.clock(), limits.eject_after_failures, limits.eject_seconds):
            log.warning("endpoint %s ejected: /metrics failing (%r)", ep.id, reason)

    def endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        now = self.clock()
        for ep in removed:
            self.warmup.left(ep)
            self.estimator.forget(ep.id)
            self.router.history.forget(ep.id)
            self.accounting.forget(ep.id)
            self.peers.forget(ep.id)
            self.metrics.endpoint_left(ep.id, now)
        joining = {ep.id for ep in added}
        for ep in added:
            self.metrics.init_endpoint(ep.pool, ep.id)
            # Pods that were there before (not joining with it) are what it is warmed against.
            others = [m for m in self.endpoints.in_pool(ep.pool) if m.id not in joining]
            self.warmup.joined(ep, others, now)
        self.metrics.sweep(now)
        self.flow.pump()

    def pool_removed(self, pool: str) -> None:
        """`pool` left the configuration (its pods left before, through `endpoints_changed`):
        forget its hot prefixes and the other replicas' counts of them, and its metric series
        (once its answers in flight are counted)."""
        self.warmup.forget_pool(pool)
        self.metrics.pool_left(pool, self.clock())

    def endpoint_load(self) -> MutableMapping[str, int]:
        """Requests in flight per endpoint id (for tests and /debug)."""
        now = self.clock()
        return {ep.id: self.accounting.load(ep.id, now).in_flight for ep in self.endpoints.all()}
