"""Flow control: a request waits in the router while every pod it may use is saturated.

**Saturation** (`saturation.py`): a pod has room while its engine's waiting queue (scraped),
this router's requests on it not past their prefill, its KV cache usage and this router's
unprefilled tokens on it are under the limits; slots granted to queued requests are reserved.

**Admission** (`RoutingCore.admit`): a request whose candidates (the pods routing would consider:
for batch, batch pods and borrowable online pods) have room is planned at once, as without flow
control. Otherwise it joins the queue of its class and pools, unless that queue holds
`max_queued_requests`, all queues hold `max_queued_bytes` of bodies, or its deadline (header
`x-kvgate-deadline-ms`, else the class's `*_max_wait_seconds`) is shorter than the wait the
queue's recent dispatch rate predicts: those get 429 with `retry-after` at once.

**Dispatch** (`pump`, called by every hook that can free room: first byte, end, failure,
cancellation, load scrape, membership change): online queues before batch; in each, waiters in
fair-queue order (`fair_queue.py`: tenant priority, then start-time fair queueing over prompt
tokens by tenant weight, and within a tenant by arrival time plus `prefill_time_weight` x the
request's predicted prefill time, so that a short prompt does not wait behind a long one that
arrived just before it), each granted a slot on:

1. its prefix holder (the candidate with the most cached tokens when it arrived) if that has room
   (the waiters of the head's tenant and priority whose holder has room are served first, so a
   slot that opens on a holder goes to a request that hits there);
2. else nothing yet, while it has waited less than twice the prefill its hit saves (hit tokens
   / the holder's prefill rate, x 2, capped at `policy.max_affinity_wait_seconds`): a miss
   costs the request that prefill, and costs it again to the requests queued behind the
   recompute on a saturated pod, so waiting for the holder is still cheaper; later waiters may
   pass it meanwhile. (With the prefill saved once, shared-prefix at 130% load lost a tenth of
   its hits to recomputes: mean TTFT 0.188 s, hit rate 0.780; twice: 0.094 s, 0.857;
   docs/benchmarks.md);
3. else the pod with room holding most of its prefix.

A waiter granted a slot on a pod will compute its prompt there: the waiters behind it that share
more of their prompt's leading blocks with it than any pod held when they arrived take that pod
as their holder (their wait for it counted from then). Past capacity a burst of requests on one
new prefix all queue before any pod holds it; without this, each would compute it wherever a
slot opened first (the queue's own blocks in flight: on the Mooncake trace at 130% load on 4
pods, hit rate 0.011 -> 0.014, mean TTFT 14.43 -> 13.95 s; docs/benchmarks.md).

A granted waiter is planned by the policy over the pods with room (its slot, and the tokens it
will prefill there, stay reserved until it is sent: the next grants of the same dispatch see
them). A waiter whose deadline passes is answered 429 `deadline_exceeded` with
`retry-after`; one whose client leaves is removed (`cancel`). At shutdown queued requests keep
being dispatched during the grace; the drain answers those still queued at its end (503,
`retry-after`). Plain synchronous code on the routing core's clock, so the discrete-event bench
runs it too.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvgate.api.router_config import FlowControlConfig, RouterConfig
from kvgate.discovery.endpoints import Endpoint, every_one_ejected
from kvgate.router.core.accounting import Accounting
from kvgate.router.core.classify import Classification
from kvgate.router.core.errors import RouterError, bad_request, overloaded
from kvgate.router.core.fair_queue import FairQueue, Queued
from kvgate.router.core.keys import RequestKeys
from kvgate.router.core.saturation import Saturation
from kvgate.router.core.tenant_shares import TenantShares
from kvgate.router.metrics import RouterMetrics

if TYPE_CHECKING:
    from kvgate.router.core.lifecycle import ClientRequest

QueueKey = tuple[
    str, tuple[str, ...], tuple[str, ...], str | None
]  # class, home and borrow pools, pinned pod
_CLASS_ORDER = {"online": 0, "batch": 1}
# Waiters looked at per queue and pump: held waiters (rule 2) are passed, not re-sorted.
_MAX_SCAN = 64
# Recent grants of a queue kept to estimate its dispatch rate.
_RATE_WINDOW = 32
_RATE_MIN_GRANTS = 8
#: A queued request waits for its prefix holder up to this many times the prefill its hit saves
#: (dispatch step 2): the miss costs the request that prefill, and as much again to the requests
#: queued behind the recompute on a saturated pod.
MISS_COST_FACTOR = 2.0


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request. `on_done(waiter)` is called once: granted (`error` None, a slot on
    `granted_to` reserved) or refused (`error` set)."""

    request: ClientRequest
    classification: Classification
    key: QueueKey
    pool: str  # metrics label: the queue's first pool
    enqueued_at: float
    deadline_at: float
    body_bytes: int
    hits: Mapping[str, int]  # cached tokens per candidate on arrival (+ what waiters ahead bring)
    holder: str | None  # the candidate holding most of its prefix (on arrival, or as it waited)
    hold_seconds: float  # how long it may wait for `holder` while another pod has room
    on_done: Callable[[Waiter], None]
    keys: RequestKeys | None = None  # its prompt's block keys (prefixes shared in the queue)
    prefill_tokens_per_second: float = 0.0  # its best candidate's on arrival; 0: unknown
    holder_since: float = 0.0  # when `holder` became its holder
    node: Queued[Waiter] | None = None  # its place while queued
    place: Queued[Waiter] | None = None  # its place, kept after it left (`requeue`)
    prompt_tokens: int = 0  # what it prefills on a pod that holds none of it
    granted_to: str | None = None
    granted_tokens: int = 0  # what it will prefill on `granted_to` (reserved there with the slot)
    error: RouterError | None = None
    done: bool = False
    seq: int = 0  # its number each time it joins a queue (deadline bookkeeping)


@dataclass(slots=True, eq=False)
class _Queue:
    key: QueueKey
    classification: Classification  # any waiter's: the candidates depend only on the key
    pool: str
    fair: FairQueue[Waiter] = field(default_factory=FairQueue)
    grants: deque[float] = field(default_factory=lambda: deque(maxlen=_RATE_WINDOW))

    def dispatch_rate(self) -> float | None:
        """Grants per second over the recent window of this backlog; None until enough were
        seen. The window starts again whenever the queue fills from empty: a rate measured
        across the idle gaps between two backlogs would read too slow, and refuse the first
        requests of the next burst for a deadline the queue would meet."""
        grants = self.grants
        if len(grants) < _RATE_MIN_GRANTS or grants[-1] <= grants[0]:
            return None
        return (len(grants) - 1) / (grants[-1] - grants[0])


class FlowControl:
    """The admission queues of one routing core. Not thread-safe (one event loop)."""

    def __init__(
        self,
        config: RouterConfig,
        candidates: Callable[[Classification, float], list[Endpoint]],
        accounting: Accounting,
        metrics: RouterMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._candidates = candidates
        self.saturation = Saturation(accounting)
        self._metrics = metrics
        self._clock = clock
        self._queues: dict[QueueKey, _Queue] = {}
        # Deadlines of the waiters queued now: (deadline, join number) in a heap, the waiter by
        # join number (entries of waiters gone are skipped, and dropped when they pile up; the
        # heap holds no waiter, so a gone request's body is not kept alive by it).
        self._deadlines: list[tuple[float, int]] = []
        self._joined_waiters: dict[int, Waiter] = {}
        self._seq = itertools.count()
        self._bytes = 0
        self._waiting = 0
        self.shares = TenantShares()
        self.configure(config)

    def configure(self, config: RouterConfig) -> None:
        self.config: FlowControlConfig = config.flow_control
        self.saturation.configure(self.config, config.load_metrics.stale_after_seconds)
        self._affinity_cap = config.policy.max_affinity_wait_seconds
        self._tenants = {t.name: (t.priority, t.weight) for t in config.tenants.tenants}
        weights = {config.tenants.anonymous_tenant: 1.0}
        weights.update({t.name: t.weight for t in config.tenants.tenants})
        self.shares.configure(self.config.fair_share_window_seconds, weights)
        # Queues of pools and classes a reload removed go once empty (their rate window too).
        self._queues = {key: q for key, q in self._queues.items() if q.fair}

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def __len__(self) -> int:
        return self._waiting

    # -- saturation ------------------------------------------------------------------------

    def usable(self, cls: Classification, candidates: list[Endpoint], now: float) -> list[Endpoint]:
        """The candidates `cls`'s tenant may send to now (`tenant_shares.py`)."""
        ids = (ep.id for ep in candidates)  # read only when a share may apply
        allowed = self.shares.allowed(cls.tenant or "", ids, now)
        return candidates if allowed is None else [ep for ep in candidates if ep.id in allowed]

    def batch_waiting(self, pool: str) -> int:
        """Batch requests queued with no batch pool of their own, for a pod of `pool` (an online
        pool: they run on one of its pods once it has room under the borrowing limits). Those
        with a batch pool wait for it: online traffic does not make room for them."""
        return sum(
            len(queue.fair)
            for (request_class, home, borrow, _pinned), queue in self._queues.items()
            if request_class == "batch" and not home and pool in borrow
        )

    def slots(self, ep: Endpoint, now: float, *, fail_open: bool) -> int:
        return self.saturation.slots(ep, now, fail_open=fail_open)

    def any_room(self, endpoints: Iterable[Endpoint], now: float, *, fail_open: bool) -> bool:
        return self.saturation.any_room(endpoints, now, fail_open=fail_open)

    # -- admission -------------------------------------------------------------------------

    def deadline_seconds(self, cls: Classification, headers: Mapping[str, str]) -> float:
        """The request's queue deadline: its header's (cut to `max_deadline_seconds`), else its
        class's. Raises RouterError (400) on a header that is not a positive integer."""
        limits = self.config
        name = limits.deadline_header
        raw = headers.get(name) if name else None
        if raw is None:
            if cls.request_class == "batch":
                return limits.batch_max_wait_seconds
            return limits.online_max_wait_seconds
        text = raw.strip()
        if not (text.isascii() and text.isdigit() and 0 < len(text) <= 12 and int(text) > 0):
            raise bad_request(
                f"{name} must be a positive whole number of milliseconds", code="invalid_deadline"
            )
        return min(int(text) / 1000.0, limits.max_deadline_seconds)

    def enqueue(
        self,
        request: ClientRequest,
        cls: Classification,
        *,
        prompt_tokens: int,
        hits: Mapping[str, int],
        hold_seconds: float,
        prefill_seconds: float,
        on_done: Callable[[Waiter], None],
        keys: RequestKeys | None = None,
        prefill_tokens_per_second: float = 0.0,
    ) -> Waiter:
        """Queue `request`, or raise RouterError (429 with retry-after, 400 for a bad deadline
        header). `hits`: cached tokens per candidate when it arrived; `prefill_seconds`: its
        predicted prefill time on its best candidate (its place among its tenant's waiters);
        `keys` and `prefill_tokens_per_second` (that candidate's rate): to wait for the pod a
        waiter ahead of it sharing its prefix is granted (None, 0: it does not)."""
        now = self._clock()
        deadline = self.deadline_seconds(cls, request.headers)
        key = _queue_key(cls)
        queue = self._queues.get(key)
        pool = (cls.home_pools or cls.borrow_pools)[0].key
        priority, weight = self._tenants.get(cls.tenant or "", (0, 1.0))
        flow = cls.tenant or ""
        new_backlog = queue is None or not queue.fair  # the last one's rate spans an idle gap
        victims = self._make_room(queue, request.body_bytes, priority, flow, pool, cls)
        if queue is None:
            queue = self._queues[key] = _Queue(key, cls, pool)
        queue.classification = cls  # the latest pools' configuration
        holder = max(hits, key=lambda ep: hits[ep]) if hits else None
        if holder is not None and hits[holder] <= 0:
            holder = None
        waiter = Waiter(
            request=request,
            classification=cls,
            key=key,
            pool=pool,
            enqueued_at=now,
            deadline_at=now + deadline,
            body_bytes=request.body_bytes,
            hits=hits,
            holder=holder,
            hold_seconds=min(max(hold_seconds, 0.0), self._affinity_cap),
            on_done=on_done,
            keys=keys,
            prefill_tokens_per_second=prefill_tokens_per_second,
            holder_since=now,
            prompt_tokens=prompt_tokens,
        )
        if new_backlog:
            queue.grants.clear()
        waiter.node = waiter.place = queue.fair.push(
            waiter,
            flow,
            band=priority,
            cost=prompt_tokens,
            weight=weight,
            urgency=now + self._passed_for(prefill_seconds, deadline),
        )
        expected = self._expected_wait(queue, queue.fair.position(waiter.node))
        for victim in victims:  # back in, to leave counted (`_push_out`) or to stay
            queue.fair.restore(victim)
        if expected is not None and expected > deadline:
            queue.fair.remove(waiter.node)
            self._refused(pool, cls.request_class, "deadline_exceeded")
            raise overloaded(
                f"the queue's expected wait ({expected:.1f} s) exceeds the request's deadline "
                f"({deadline:.1f} s)",
                code="deadline_exceeded",
                retry_after_seconds=expected,
            )
        self._joined(waiter)  # counted before the victims' callbacks run
        for victim in victims:
            self._push_out(victim.item)
        return waiter

    def _make_room(
        self,
        queue: _Queue | None,
        body_bytes: int,
        band: int,
        flow: str,
        pool: str,
        cls: Classification,
    ) -> list[Queued[Waiter]]:
        """The waiters a newcomer of (`band`, `flow`) pushes out of a full `queue`: the newest
        of the tenant holding the most of it, one by one, while the newcomer's tenant would
        still hold less. They are taken out of the fair queue only, for the caller to restore
        and then push out once the newcomer is in; where they could not make room, none is
        taken out and the newcomer is refused (429 queue_full)."""
        victims: list[Queued[Waiter]] = []
        freed = 0
        while self._full(queue, body_bytes - freed):
            victim = queue.fair.newest_of_largest_flow() if queue is not None else None
            if queue is None or victim is None or not _may_push_out(queue, victim, band, flow):
                if queue is not None:
                    for taken in victims:
                        queue.fair.restore(taken)
                self._refused(pool, cls.request_class, "queue_full")
                wait = self._expected_wait(queue, len(queue.fair) if queue else 0)
                raise overloaded(
                    "the router's queue for these pods is full; retry later",
                    code="queue_full",
                    retry_after_seconds=wait if wait is not None else 1.0,
                )
            queue.fair.remove(victim)
            victims.append(victim)
            freed += victim.item.body_bytes
        return victims

    def _full(self, queue: _Queue | None, body_bytes: int) -> bool:
        limits = self.config
        return (queue is not None and len(queue.fair) >= limits.max_queued_requests) or (
            self._bytes + body_bytes > limits.max_queued_bytes
        )

    def _passed_for(self, prefill_seconds: float, deadline: float) -> float:
        """How long later than its arrival a waiter counts among its tenant's: its predicted
        prefill time x `prefill_time_weight`, at most its deadline (0 when unknown)."""
        if not math.isfinite(prefill_seconds) or prefill_seconds <= 0:
            return 0.0
        return min(self.config.prefill_time_weight * prefill_seconds, deadline)

    def _push_out(self, waiter: Waiter) -> None:
        """`waiter` leaves to make room for a tenant holding less of the queue: 429."""
        queue = self._queues.get(waiter.key)
        wait = self._expected_wait(queue, 0) if queue else None
        self._leave(waiter, "pushed_out")
        self._refused(waiter.pool, waiter.classification.request_class, "queue_full")
        waiter.error = overloaded(
            "the router's queue filled up with this tenant's requests; retry later",
            code="queue_full",
            retry_after_seconds=wait if wait is not None else 1.0,
        )
        self._finish(waiter)

    def admitted_at_once(self, pool: str, request_class: str) -> None:
        """A request that did not wait: its queue time (0) counts in the percentiles."""
        self._metrics.child(self._metrics.queue_wait, pool, request_class, "dispatched").observe(0)

    def requeue(self, waiter: Waiter) -> None:
        """A granted waiter found no pod it may use when planned (their state moved on since
        the grant): back to its place in the queue, its slot freed."""
        self.release(waiter)
        place = waiter.place
        if place is None:
            return
        queue = self._queues.get(waiter.key)
        if queue is None:
            queue = self._queues[waiter.key] = _Queue(
                waiter.key, waiter.classification, waiter.pool
            )
        queue.fair.restore(place)
        waiter.node, waiter.done, waiter.error = place, False, None
        self._joined(waiter)

    def _joined(self, waiter: Waiter) -> None:
        self._waiting += 1
        self._bytes += waiter.body_bytes
        waiter.seq = next(self._seq)
        self._joined_waiters[waiter.seq] = waiter
        heapq.heappush(self._deadlines, (waiter.deadline_at, waiter.seq))
        m = self._metrics
        m.child(m.queued, waiter.pool, waiter.classification.request_class).inc()
        m.queued_bytes.set(self._bytes)

    def cancel(self, waiter: Waiter) -> None:
        """The client left (or the request was abandoned): out of the queue, reservation freed."""
        if not waiter.done:
            self._leave(waiter, "cancelled")
            waiter.done = True
        self.release(waiter)

    def expire(self, waiter: Waiter) -> None:
        """`waiter`'s deadline passed: it is answered 429 (if it was not granted already)."""
        if waiter.done:
            return
        queue = self._queues.get(waiter.key)
        wait = self._expected_wait(queue, 0) if queue else None
        self._leave(waiter, "deadline")
        self._refused(waiter.pool, waiter.classification.request_class, "deadline_exceeded")
        waiter.error = overloaded(
            "no pod had room for the request within its deadline",
            code="deadline_exceeded",
            retry_after_seconds=wait if wait is not None else 1.0,
        )
        self._finish(waiter)

    def release(self, waiter: Waiter) -> None:
        """A granted waiter was sent (or will not be): its reserved slot is free again."""
        ep = waiter.granted_to
        if ep is None:
            return
        self.saturation.release(ep, waiter.granted_tokens)
        waiter.granted_to, waiter.granted_tokens = None, 0

    # -- dispatch --------------------------------------------------------------------------

    def pump(self) -> None:
        """Grant the waiters that can go now (see the module docstring); answer expired ones."""
        if not self._waiting:
            return
        now = self._clock()
        self._expire_due(now)
        for queue in sorted(self._queues.values(), key=lambda q: _CLASS_ORDER[q.key[0]]):
            if queue.fair:
                self._pump_queue(queue, now)

    def _pump_queue(self, queue: _Queue, now: float) -> None:
        candidates = self._candidates(queue.classification, now)
        fail_open = every_one_ejected(candidates, now)
        free = self.saturation.room(candidates, now, fail_open=fail_open)
        leaving = pinned_to_leaving_pod(queue.classification, candidates)
        if leaving:
            free = {ep.id: len(queue.fair) for ep in candidates}  # they go now
        if not free:
            return
        by_id = {ep.id: ep for ep in candidates}
        ids = list(by_id)
        window = [node for _, node in zip(range(_MAX_SCAN), queue.fair, strict=False)]
        granted: list[Waiter] = []
        granted_pods: dict[str, set[str]] = {}  # tenant -> pods granted in this pump
        # Two passes over the window: first the waiters of the head's tenant and priority whose
        # prefix holder has room (rule 1), then every waiter in order (rules 2-3). A slot that
        # opens on a holder goes to a request that will hit there rather than to the head, which
        # would recompute elsewhere what another pod holds: past capacity a hit is capacity for
        # everyone. Other tenants and priorities keep their fair-queue order.
        head = window[0]
        for holders_only in (True, False):
            for node in window:
                if not free:
                    break
                waiter = node.item
                if waiter.granted_to is not None:
                    continue
                if holders_only and (
                    node.band != head.band
                    or node.flow != head.flow
                    or waiter.holder is None
                    or waiter.holder not in free
                ):
                    continue
                tenant = node.flow
                mine = granted_pods.setdefault(tenant, set())
                allowed = self.shares.allowed(tenant, ids, now, extra=mine)
                usable = (
                    free if allowed is None else {ep: n for ep, n in free.items() if ep in allowed}
                )
                target = self._target(waiter, usable, now) if usable else None
                if target is None:
                    continue
                mine.add(target)
                waiter.granted_to = target
                waiter.granted_tokens = max(0, waiter.prompt_tokens - waiter.hits.get(target, 0))
                self.saturation.reserve(target, waiter.granted_tokens)
                if leaving:  # a draining pod counts no slot: every follow-up goes anyway
                    left = free[target] - 1
                else:
                    left = self.saturation.slots(by_id[target], now, fail_open=fail_open)
                if left:
                    free[target] = left
                else:
                    del free[target]
                granted.append(waiter)
                self._follow(waiter, target, window, now)
        for waiter in granted:
            queue.grants.append(now)
            self._leave(waiter, "dispatched")
            self._finish(waiter)

    def _target(self, waiter: Waiter, free: Mapping[str, int], now: float) -> str | None:
        holder = waiter.holder
        if holder is not None:
            if holder in free:
                return holder
            if now - waiter.holder_since < waiter.hold_seconds:
                return None
        hits = waiter.hits
        return max(free, key=lambda ep: (hits.get(ep, 0), free[ep]))

    def _follow(
        self, granted: Waiter, target: str, window: Sequence[Queued[Waiter]], now: float
    ) -> None:
        """The waiters in `window` sharing more leading blocks with `granted` than any pod held
        when they arrived wait for `target` now: it holds them once `granted` is prefilled. One
        that another pod will hold as much of waits for none (a head granted to every pod)."""
        if granted.keys is None or not granted.keys.block_keys:
            return
        keys = granted.keys.block_keys
        first = keys[0]
        for node in window:
            other = node.item
            if other.granted_to is not None or not other.hits or other.keys is None:
                continue  # granted, or what the pods held on arrival is unknown
            theirs = other.keys.block_keys
            if not theirs or theirs[0] != first:
                continue
            shared = _shared_blocks(keys, theirs) * other.keys.block_tokens
            best = max(other.hits.values(), default=0)
            if shared < best or (shared == best and other.hits.get(target, 0) == best):
                continue
            other.hits = {**other.hits, target: shared}
            if shared == best:  # another pod will hold as much: no pod is its holder
                other.holder = None
                continue
            other.holder, other.holder_since = target, now
            rate = other.prefill_tokens_per_second
            if rate > 0:
                hold = MISS_COST_FACTOR * shared / rate
                other.hold_seconds = min(max(other.hold_seconds, hold), self._affinity_cap)

    # -- bookkeeping -----------------------------------------------------------------------

    def _expire_due(self, now: float) -> None:
        deadlines, joined = self._deadlines, self._joined_waiters
        while deadlines and (deadlines[0][1] not in joined or deadlines[0][0] <= now):
            waiter = joined.get(heapq.heappop(deadlines)[1])
            if waiter is not None:
                self.expire(waiter)

    def _leave(self, waiter: Waiter, outcome: str) -> None:
        """Out of its queue (served when `outcome` is dispatched), counted and measured."""
        queue = self._queues.get(waiter.key)
        node, waiter.node = waiter.node, None
        if queue is None or node is None:
            return
        if not (queue.fair.take(node) if outcome == "dispatched" else queue.fair.remove(node)):
            return
        self._joined_waiters.pop(waiter.seq, None)
        if not queue.fair and waiter.classification.pinned_tag is not None:
            del self._queues[waiter.key]  # one per pod that stored a response: not kept empty
        self._waiting -= 1
        self._bytes -= waiter.body_bytes
        cls = waiter.classification.request_class
        m = self._metrics
        m.child(m.queued, waiter.pool, cls).dec()
        m.queued_bytes.set(self._bytes)
        m.child(m.queue_wait, waiter.pool, cls, outcome).observe(self._clock() - waiter.enqueued_at)
        if len(self._deadlines) > 2 * self._waiting + 64:  # drop the entries of waiters gone
            self._deadlines = [(w.deadline_at, seq) for seq, w in self._joined_waiters.items()]
            heapq.heapify(self._deadlines)

    def _finish(self, waiter: Waiter) -> None:
        waiter.done = True
        waiter.on_done(waiter)

    def _expected_wait(self, queue: _Queue | None, ahead: int) -> float | None:
        rate = queue.dispatch_rate() if queue is not None else None
        return None if rate is None else (ahead + 1) / rate

    def _refused(self, pool: str, request_class: str, reason: str) -> None:
        self._metrics.child(self._metrics.queue_refusals, pool, request_class, reason).inc()


def pinned_to_leaving_pod(cls: Classification, candidates: Iterable[Endpoint]) -> bool:
    """A Responses follow-up whose pod began to leave: a draining pod takes no queued work, but
    no other pod can serve the follow-up, so it goes at once (queued or arriving)."""
    return cls.pinned_tag is not None and any(ep.draining for ep in candidates)


def _may_push_out(queue: _Queue | None, victim: Queued[Waiter], band: int, flow: str) -> bool:
    """A newcomer of (`band`, `flow`) may push `victim` out: it is of a lower band, or of the
    same band and its flow would still hold fewer than the victim's."""
    if queue is None or victim.band > band:
        return False
    return victim.band < band or queue.fair.count(band, flow) + 1 < queue.fair.count(
        victim.band, victim.flow
    )


def _shared_blocks(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """How many leading blocks two prompts share, by bisection: block keys are chained (each
    digests its whole prefix), so equal keys at `i` mean equal keys before `i`. O(log n), so a
    queue of waiters on one 128k-token prompt costs each grant microseconds, not milliseconds.
    (`Accounting.held` bisects the same way against a set; a shared helper taking a predicate
    cost it 9 µs more per request on 8 pods of 2,048-block prompts, so each keeps its loop.)"""
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low]; the answer is at most high
    while low < high:
        mid = (low + high + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return low


def _queue_key(cls: Classification) -> QueueKey:
    """Requests that may use the same pods wait in one queue (a Responses follow-up only its
    pinned pod)."""
    return (
        cls.request_class,
        tuple(p.key for p in cls.home_pools),
        tuple(p.key for p in cls.borrow_pools),
        cls.pinned_tag,
    )
