"""Choose a pod for one request: classify → keys → directory lookup → policy.

1. Classify (`classify.py`): candidate pools, class, tenant salt, session.
2. Candidates: ready, non-ejected, non-draining endpoints of the class's home pools; plus, for
   batch requests, online endpoints whose load is under the borrowing limits (so online traffic
   never waits behind batch); plus, for online requests with no home endpoint, batch endpoints.
   Pods warming up take no client request, then a growing share (`warmup.py`). A Responses API
   follow-up (`Classification.pinned_tag`) has one candidate: the pod holding its previous
   response, draining or warming up (404 once it has left).
3. Pools are grouped by hashing identity (`keys.keyer_identity`); each group's keys are computed
   once, its pools' directories are looked up, and the policy decides over the group. With
   several groups (pools with different tokenizers or block sizes) the decision with the lowest
   predicted TTFT wins.
   Each endpoint's snapshot counts this router's in-flight and pending prefill, plus the other
   replicas' while their view is fresh (`peer_load.py`).
4. The routing core (`lifecycle.py`) records the decision; the proxy sends the request.

Everything here is in memory except the directory lookup (a Redis round trip with the redis
backend, which `FallbackIndex` turns into a local lookup while Redis is down).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvgate.api.router_config import PoolConfig, RouterConfig
from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex
from kvgate.discovery.endpoints import Endpoint, EndpointSet, every_one_ejected
from kvgate.prefix import LoraKey
from kvgate.router.core.accounting import Accounting, EndpointLoad
from kvgate.router.core.cache_policy import added_cache_ops
from kvgate.router.core.classify import Classification, Classifier
from kvgate.router.core.errors import RouterError, unavailable
from kvgate.router.core.keying import KeyingPool
from kvgate.router.core.keys import Keyer, RequestKeys, keyer_identity
from kvgate.router.core.peer_load import PeerLoads
from kvgate.router.core.response_ids import tagged
from kvgate.scoring.base import (
    ChoiceHistory,
    Decision,
    EndpointSnapshot,
    EngineLoad,
    NoEligibleEndpointError,
    Policy,
    RoutingRequest,
)
from kvgate.scoring.output_length import OutputLengthEstimator
from kvgate.scoring.prefill_rate import PrefillRateEstimator


@dataclass(frozen=True)
class RoutePlan:
    """Everything decided about one request before it is sent."""

    classification: Classification
    kind: str  # "chat" | "completion"
    keys: RequestKeys
    decision: Decision
    endpoint: Endpoint
    pool: PoolConfig
    decision_seconds: float
    # `cache` ops the router added for this pool (cache_policy.py); None: the body as sent.
    added_cache: dict[str, Any] | None = None
    # The answer's expected length the decode price used (0: not priced in this pool).
    expected_output_tokens: float = 0.0

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.keys.prompt_tokens - self.decision.predicted_hit_tokens)


class RouterState:
    """What a config file determines; replaced whole on reload (in-flight requests keep theirs)."""

    def __init__(
        self,
        config: RouterConfig,
        policy: Policy,
        keyer_factory: Callable[[PoolConfig], Keyer],
    ) -> None:
        self.config = config
        self.policy = policy
        self.classifier = Classifier(config)
        self.pools = {p.key: p for p in config.pools}
        self._pod_headers = {p.key: _pod_headers(p) for p in config.pools if p.engine.api_key}
        self._keyers: dict[tuple[Any, ...], Keyer] = {}
        self.keyer_by_pool: dict[str, Keyer] = {}
        for pool in config.pools:
            ident = keyer_identity(pool.engine)
            if ident not in self._keyers:
                self._keyers[ident] = keyer_factory(pool)
            self.keyer_by_pool[pool.key] = self._keyers[ident]

    def pod_headers(self, pool: str) -> list[tuple[bytes, bytes]]:
        """What every request to a pod of `pool` carries: its engines' API key, if any."""
        return self._pod_headers.get(pool, [])


def _pod_headers(pool: PoolConfig) -> list[tuple[bytes, bytes]]:
    """The pool's `engine.api_key` as a header. Raises ValueError (a config error) when it is
    empty or cannot be sent as a header."""
    assert pool.engine.api_key is not None
    key = pool.engine.api_key.read().strip()
    if not key or not key.isascii() or not key.isprintable():
        raise ValueError(f"pool {pool.key}: engine.api_key is empty or not printable ASCII")
    return [(b"authorization", b"Bearer " + key.encode())]


class Router:
    """Routing decisions over live endpoint state. One per process; not thread-safe."""

    def __init__(
        self,
        state: RouterState,
        endpoints: EndpointSet,
        indexes: Mapping[str, BlockIndex],
        *,
        accounting: Accounting | None = None,
        estimator: PrefillRateEstimator | None = None,
        output_lengths: OutputLengthEstimator | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        admits: Callable[[str, float, random.Random], bool] | None = None,
        peers: PeerLoads | None = None,
        batch_waiting: Callable[[str], int] | None = None,
    ) -> None:
        self.state = state
        self.endpoints = endpoints
        self.indexes = indexes  # pool key -> index (owned by the app)
        self.accounting = accounting or Accounting()  # owned by the routing core
        self.estimator = estimator or PrefillRateEstimator()
        self.output_lengths = output_lengths or OutputLengthEstimator()
        self.history = ChoiceHistory()
        self.rng = rng or random.Random(state.config.policy.seed)
        self.clock = clock
        self.keying = KeyingPool(state.config.keying)
        # May a client request go to this endpoint now (pods warming up: `warmup.py`)?
        self.admits = admits
        # The other router replicas' load on each endpoint (`peer_load.py`), added to ours.
        self.peers = peers
        # Batch requests queued in flow control that may borrow a pod of a pool (`admission.py`).
        self.batch_waiting = batch_waiting

    async def plan(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        kind: str,
        *,
        exclude: Iterable[str] = (),
        classification: Classification | None = None,
        keys_by_pool: dict[str, RequestKeys] | None = None,
        record: bool = True,
        body_bytes: int = 0,
    ) -> RoutePlan:
        """Decide. `exclude`: endpoint ids already tried (retries); `record=False` for a decision
        that is only explained (round-robin history stays as it was). Raises RouterError."""
        started = time.perf_counter()
        state = self.state
        cls = classification or state.classifier.classify(body, headers, kind)
        now = self.clock()
        excluded = set(exclude)
        groups = self._candidate_groups(cls, now, excluded)
        if not groups:
            if cls.pinned_tag is not None and self._pinned_pod(cls) is None:
                raise RouterError(
                    404,
                    "The previous response is not available: the model server that stored it "
                    "has left the pool.",
                    code="previous_response_not_found",
                    param="previous_response_id",
                )
            raise unavailable(f"no ready endpoint serves model `{cls.model}`")
        best: tuple[Decision, RoutingRequest, RequestKeys, dict[str, Any] | None] | None = None
        for keyer, lora, members in groups:
            pool = state.pools[members[0].spec.pool]
            keys, added = await self._pool_keys(
                keyer, lora, pool, cls, body, kind, keys_by_pool, body_bytes
            )
            matched, on_gpu = await self._lookup(keys, members)
            sharers: dict[str, int] | None = None
            if state.policy.counts_inflight_blocks:
                self._add_inflight(keys, members, matched, on_gpu)
                sharers = self._sharers(keys, matched)
            request = RoutingRequest(
                model=cls.model,
                prompt_tokens=keys.prompt_tokens,
                block_tokens=keys.block_tokens,
                block_keys=keys.block_keys,
                keys_exact=keys.exact,
                copyable=keys.copyable,
                request_class=cls.request_class,
                tenant=cls.tenant,
                session_id=cls.session_id,
                gpu_matched_blocks=on_gpu,
                lora_adapter=lora.name if lora is not None else None,
                prefix_sharers=sharers,
                batch_waiting=self._batch_waiting(cls, pool),
                expected_output_tokens=self.output_lengths.expected(
                    pool.key, requested_max_tokens(body), state.policy.decode_min_output_ratio
                ),
            )
            snapshots = self.snapshots(members, now)
            if cls.pinned_tag is not None:  # the only pod that can answer, leaving or not
                snapshots = [replace(s, draining=False) for s in snapshots]
            try:
                decision = state.policy.decide(
                    request, snapshots, matched, now=now, rng=self.rng, history=self.history
                )
            except NoEligibleEndpointError:
                continue
            if best is None or self._before(decision, best[0]):
                best = (decision, request, keys, added)
        if best is None:
            raise unavailable(f"no eligible endpoint for model `{cls.model}`")
        decision, request, keys, added = best
        endpoint = self.endpoints.get(decision.endpoint_id)
        if endpoint is None:
            if not any(ep.spec.id == decision.endpoint_id for _, _, m in groups for ep in m):
                # the policy returned an id it was not given: a bug, not the client's
                raise RouterError(500, "policy chose an unknown endpoint", type="server_error")
            # The pod left while the directory was asked (discovery ran during the await):
            # decide again without it. Each round excludes one more id, so this ends.
            return await self.plan(
                body, headers, kind,
                exclude=excluded | {decision.endpoint_id},
                classification=cls, keys_by_pool=keys_by_pool, record=record,
                body_bytes=body_bytes,
            )  # fmt: skip
        plan = RoutePlan(
            classification=cls,
            kind=kind,
            keys=keys,
            decision=decision,
            endpoint=endpoint,
            pool=state.pools[endpoint.pool],
            decision_seconds=time.perf_counter() - started,
            added_cache=added,
            expected_output_tokens=request.expected_output_tokens,
        )
        if record:
            self.history.record(decision.endpoint_id, plan.uncached_tokens, now)
        return plan

    def _before(self, decision: Decision, other: Decision) -> bool:
        """Between groups of pools (engines keying apart): the lower predicted TTFT, on a tie
        the pod chosen less recently, so that equal groups share the traffic."""
        last = self.history.last_chosen
        return (decision.predicted_ttft_seconds, last(decision.endpoint_id)) < (
            other.predicted_ttft_seconds,
            last(other.endpoint_id),
        )

    async def _pool_keys(
        self,
        keyer: Keyer,
        lora: LoraKey | None,
        pool: PoolConfig,
        cls: Classification,
        body: Mapping[str, Any],
        kind: str,
        keys_by_pool: dict[str, RequestKeys] | None,
        body_bytes: int,
    ) -> tuple[RequestKeys, dict[str, Any] | None]:
        """The request's keys toward `pool` (cached in `keys_by_pool`), of the body as it will
        be sent there: with the `cache` ops the router adds for that pool (`cache_policy.py`)."""
        added = added_cache_ops(body, kind, pool, self.state.config.cache_ops)
        keys = keys_by_pool.get(pool.key) if keys_by_pool else None
        if keys is None:
            keys = await self._keys(
                keyer,
                body if added is None else {**body, "cache": added},
                kind,
                cls.cache_salt,
                lora,
                body_bytes,
                cls.session_id,
            )
            if keys_by_pool is not None:
                keys_by_pool[pool.key] = keys
        return keys, added

    async def _keys(
        self,
        keyer: Keyer,
        body: Mapping[str, Any],
        kind: str,
        salt: str | None,
        lora: LoraKey | None,
        body_bytes: int,
        session: str | None = None,
    ) -> RequestKeys:
        """Tokenize and hash: inline when small, else in a worker thread (`keying.py`)."""
        self.keying.configure(self.state.config.keying)
        return await self.keying.keys(keyer, body, kind, salt, lora, session, body_bytes=body_bytes)

    def pending_prefill_requests(self, endpoint_id: str, now: float) -> int:
        """The requests sent to the endpoint that have no first byte yet, as a snapshot would
        count them now."""
        return self._loads([endpoint_id], now)[0].pending_prefill_requests

    def _loads(self, ids: list[str], now: float) -> list[EndpointLoad]:
        """This router's load on each endpoint, plus the replicas' it shares loads with."""
        loads = self.accounting.loads(ids, now)
        if self.peers is not None:
            loads = self.peers.added(ids, loads, now)
        return loads

    def snapshots(self, members: list[Endpoint], now: float) -> list[EndpointSnapshot]:
        """Immutable views of `members` for the policy (hot path: lookups hoisted)."""
        pools = self.state.pools
        stale = self.state.config.load_metrics.stale_after_seconds
        ids = [ep.spec.id for ep in members]
        loads = self._loads(ids, now)
        rates = self._pool_rates(members)
        fail_open = every_one_ejected(members, now)
        out: list[EndpointSnapshot] = []
        for ep, mine in zip(members, loads, strict=True):
            spec, load = ep.spec, ep.load
            pool = pools.get(spec.pool)
            out.append(
                EndpointSnapshot(
                    id=spec.id,
                    pool=spec.pool,
                    pool_class=pool.pool_class if pool else "online",
                    healthy=fail_open or now >= ep.ejected_until,
                    draining=ep.draining,
                    in_flight=mine.in_flight,
                    batch_in_flight=mine.batch_in_flight,
                    pending_prefill_requests=mine.pending_prefill_requests,
                    pending_prefill_tokens=mine.pending_prefill_tokens,
                    engine=EngineLoad(
                        int(load.waiting),
                        int(load.running),
                        load.kv_cache_usage,
                        load.running_lora_adapters,
                        load.waiting_lora_adapters,
                        load.max_lora,
                        ep.recent_lora_adapters,
                        ep.pending_at_scrape,
                        load.kv_capacity_tokens,
                        load.kv_filled,
                    )
                    if ep.load_fresh(now, stale)
                    else None,
                    prefill_tokens_per_second=rates.get(spec.pool),
                )
            )
        return out

    def _batch_waiting(self, cls: Classification, pool: PoolConfig) -> int:
        if cls.request_class != "online" or self.batch_waiting is None:
            return 0
        return self.batch_waiting(pool.key)

    def _pool_rates(self, members: list[Endpoint]) -> dict[str, float]:
        """One prefill rate per pool: the median of its measured pods' estimates."""
        rate = self.estimator.rate
        by_pool: dict[str, list[float]] = {}
        for ep in members:
            r = rate(ep.spec.id)
            if r is not None:
                by_pool.setdefault(ep.spec.pool, []).append(r)
        return {pool: sorted(rs)[len(rs) // 2] for pool, rs in by_pool.items()}

    def candidates(self, cls: Classification, now: float) -> list[Endpoint]:
        """Every endpoint a decision for `cls` would consider now (flow control's view)."""
        return [
            ep
            for _keyer, _lora, members in self._candidate_groups(cls, now, set())
            for ep in members
        ]

    def serves(self, cls: Classification) -> bool:
        """Some non-draining endpoint of the class's pools exists (a request may wait for it);
        for a request pinned to a pod, that pod exists."""
        if cls.pinned_tag is not None:
            return self._pinned_pod(cls) is not None
        pools = (*cls.home_pools, *cls.borrow_pools)
        return any(not ep.draining for pool in pools for ep in self.endpoints.in_pool(pool.key))

    async def prompt_keys(
        self,
        cls: Classification,
        body: Mapping[str, Any],
        kind: str,
        keys_by_pool: dict[str, RequestKeys],
        body_bytes: int = 0,
    ) -> RequestKeys:
        """The request's keys for the first of its pools (cached in `keys_by_pool`): its prompt
        size, and its mistakes (400s) found before it waits for a pod."""
        pool = (cls.home_pools or cls.borrow_pools)[0]
        keyer = self.state.keyer_by_pool[pool.key]
        keys, _added = await self._pool_keys(
            keyer, _lora(pool, cls.model), pool, cls, body, kind, keys_by_pool, body_bytes
        )
        return keys

    def _candidate_groups(
        self, cls: Classification, now: float, excluded: set[str]
    ) -> list[tuple[Keyer, LoraKey | None, list[Endpoint]]]:
        """Candidates grouped by what their block keys depend on: the pool's keyer (tokenizer,
        hash settings) and the LoRA adapter the request names in that pool."""
        state = self.state

        def usable(pool: PoolConfig) -> list[Endpoint]:
            # Unhealthy pods go to the policy marked as such (its health filter drops them).
            eps = self.endpoints.in_pool(pool.key)
            if excluded:
                eps = [ep for ep in eps if ep.spec.id not in excluded]
            eps = [ep for ep in eps if not ep.draining]
            if self.admits is not None and eps:
                admitted = [ep for ep in eps if self.admits(ep.spec.id, now, self.rng)]
                # Every pod warming up, or every other one ejected (a hung pod would take the
                # request while a warming one idles): fail open to the warming ones too.
                if admitted and not every_one_ejected(admitted, now):
                    eps = admitted
            return eps

        if cls.pinned_tag is not None:
            chosen = self._pinned(cls, excluded)
        else:
            chosen = [ep for pool in cls.home_pools for ep in usable(pool)]
            if cls.request_class == "batch":
                for pool in cls.borrow_pools:
                    chosen.extend(ep for ep in usable(pool) if self._borrowable(ep, now))
            elif not chosen:
                chosen = [ep for pool in cls.borrow_pools for ep in usable(pool)]
        if not chosen:
            return []
        keyers, pools = state.keyer_by_pool, state.pools
        first_pool = chosen[0].spec.pool
        if all(ep.spec.pool == first_pool for ep in chosen):  # the usual case: one pool
            return [(keyers[first_pool], _lora(pools[first_pool], cls.model), chosen)]
        groups: dict[tuple[int, LoraKey | None], tuple[Keyer, LoraKey | None, list[Endpoint]]]
        groups = {}
        for ep in chosen:
            keyer = keyers[ep.spec.pool]
            lora = _lora(pools[ep.spec.pool], cls.model)
            groups.setdefault((id(keyer), lora), (keyer, lora, []))[2].append(ep)
        return list(groups.values())

    def _pinned_pod(self, cls: Classification) -> Endpoint | None:
        """The pod holding the response the request continues, in any pool serving its model
        (None: it has left, and its stored responses with it)."""
        pools = self.state.classifier.pools(cls.model)
        tag = cls.pinned_tag or ""
        return tagged((ep for pool in pools for ep in self.endpoints.in_pool(pool.key)), tag)

    def _pinned(self, cls: Classification, excluded: set[str]) -> list[Endpoint]:
        """The pinned pod, draining or warming up (no other pod can serve the request); none
        once it was tried (a retry) or once it has left (`plan` answers 404)."""
        pod = self._pinned_pod(cls)
        return [] if pod is None or pod.spec.id in excluded else [pod]

    def _borrowable(self, ep: Endpoint, now: float) -> bool:
        """An online pod takes batch work only while it has room (unknown load = no room)."""
        limits = self.state.config.borrowing
        if not ep.load_fresh(now, self.state.config.load_metrics.stale_after_seconds):
            return False
        load = ep.load
        running = max(load.running, float(self.accounting.load(ep.id, now).in_flight))
        return (
            load.waiting <= limits.max_waiting_requests
            and load.kv_cache_usage <= limits.max_kv_cache_usage
            and running < limits.max_running_requests
        )

    async def _lookup(
        self, keys: RequestKeys, members: list[Endpoint]
    ) -> tuple[dict[str, int], dict[str, int] | None]:
        """Each pod's leading matched blocks and, when a pool has a CPU offloading tier, how
        many of them lead on the GPU (a second lookup, for the pods that matched only)."""
        if not keys.block_keys:
            return {}, None
        by_pool: dict[str, list[str]] = {}
        for ep in members:
            spec = ep.spec
            by_pool.setdefault(spec.pool, []).append(spec.id)
        matched: dict[str, int] = {}
        on_gpu: dict[str, int] | None = None
        for pool, pods in by_pool.items():
            index = self.indexes.get(pool)
            if index is None:
                continue
            found = await self._held(index, keys, pods)
            matched.update(found)
            config = self.state.pools.get(pool)
            if found and config is not None and config.engine.cpu_offload:
                held = await self._held(index, keys, list(found), medium=DEFAULT_MEDIUM)
                on_gpu = {} if on_gpu is None else on_gpu
                on_gpu.update({pod: held.get(pod, 0) for pod in found})
        if on_gpu is not None:  # pools without the tier: all on the GPU
            on_gpu.update({pod: n for pod, n in matched.items() if pod not in on_gpu})
        return matched, on_gpu

    def _add_inflight(
        self,
        keys: RequestKeys,
        members: list[Endpoint],
        matched: dict[str, int],
        on_gpu: dict[str, int] | None,
    ) -> None:
        """Count as held what the requests in flight on each pod carry (`accounting.py`, in-flight
        blocks): the directory learns of those blocks only once they are computed."""
        if keys.lookup is not None or not keys.block_keys:
            return
        ahead = self.accounting.held(keys.block_keys, [ep.spec.id for ep in members])
        for pod, n in ahead.items():
            if n > matched.get(pod, 0):
                matched[pod] = n
                if on_gpu is not None:
                    on_gpu[pod] = n

    def _sharers(self, keys: RequestKeys, matched: dict[str, int]) -> dict[str, int]:
        """Per pod with a match: its requests in flight that carry the whole matched prefix."""
        if keys.lookup is not None:
            return {}
        block_keys = keys.block_keys
        carrying = self.accounting.carrying
        return {
            pod: carrying(pod, block_keys[n - 1])
            for pod, n in matched.items()
            if 0 < n <= len(block_keys)
        }

    @staticmethod
    async def _held(
        index: BlockIndex, keys: RequestKeys, pods: list[str], medium: str | None = None
    ) -> dict[str, int]:
        """Each pod's leading path blocks in one pool's index (in `medium` only, if given)."""
        found = _within(
            await index.lookup(keys.block_keys, pods, medium=medium), len(keys.block_keys)
        )
        plan = keys.lookup
        if plan is None:
            return found
        # Drops: a pod may have evicted dropped blocks and kept what follows them. The blocks
        # the final state needs, mapped back to path blocks restorable without any dropped
        # block; and up to the next needed block it lacks if it still holds the dropped blocks
        # whose drop comes after that point (a session's latest drops: one more lookup per
        # distinct end).
        needed = _within(await index.lookup(plan.keys, pods, medium=medium), len(plan.keys))
        candidates: dict[int, list[str]] = {}
        for pod, held in needed.items():
            blocks = plan.path_blocks[held]
            if blocks > found.get(pod, 0):
                found[pod] = blocks
            end = plan.needed_end[held]
            if end > found.get(pod, 0):
                candidates.setdefault(end, []).append(pod)
        # Awaited one after the other: the discrete-event bench drives this code without an
        # event loop (no gather), and the pods holding a session's history mostly share an end.
        for end, group in candidates.items():
            late = plan.late_keys(end)
            late_held = await index.lookup(late, group, medium=medium) if late else {}
            for pod in group:
                if late_held.get(pod, 0) == len(late):
                    found[pod] = end
        return found


def _within(held: Mapping[str, int], blocks: int) -> dict[str, int]:
    """A directory's counts, each cut to [0, blocks asked for]: a Redis that answers more (a
    fake server, say) must not make the lookup plan index past the request's keys."""
    return {pod: min(max(count, 0), blocks) for pod, count in held.items()}


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    """The answer's length limit the request sets (``max_completion_tokens``, else
    ``max_tokens``, else the Responses API's ``max_output_tokens``), or None."""
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _lora(pool: PoolConfig, model: str) -> LoraKey | None:
    adapter = pool.lora_for(model)
    return LoraKey(adapter.name, adapter.path) if adapter is not None else None
