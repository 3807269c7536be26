"""Share warm-ups with the other router replicas through Redis: one warm-up per joining pod.

While sharing is on (`RouterConfig.warmup_sharing_enabled`: by default whenever the directory is
Redis and warm-up is on), the background task does, for the routing core's `warmup.claims`
(`core/warmup_claims.py`, which holds the states; this module only talks to Redis):

- **claims**, as soon as pods join (`wake()`): each joining pod's claim
  (`kvgate.directory.shared_warmup.RedisWarmClaims`) goes to Redis; the answer goes back to the
  core (`claim_result`), which hands the warm requests of a claimed pod to the warmer;
- **follows**, every `FOLLOW_POLL_SECONDS` while a pod another replica warms is held back here:
  one read of the followed claims per pool (`follow_result`);
- **done**: the claimed warm-ups that ended are marked done, so the followers ramp; a mark that
  fails is queued again (`requeue_report`) and retried with the back-off while the claim lives;
- **hot prefixes**, every `warmup.share_interval_seconds`: per pool, this replica's hottest
  prefixes' request counts are published and the others' read back in the same round trip
  (`HotPrefixBoard`), into `core.warmup.peer_counts`, which a claimed warm-up ranks by.

Every call is bounded by the directory's `redis.socket_timeout_seconds`. Redis down or slow: a
claim or a follow that fails warms the pod from this replica's own history (as without
sharing), a failed publication leaves the view to age out (then the ranking is this replica's
own); each failure is counted in `kvgate_router_warm_sharing_errors_total` and retries back off
to one a second. The task and the Redis client it shares with `load_sharing.py` are
`replica_exchange.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError

from kvgate.api.router_config import RouterConfig
from kvgate.directory.redis import Client
from kvgate.directory.shared_warmup import HotPrefixBoard, RedisWarmClaims
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.core.peer_prefixes import shared_counts_ttl_seconds, shared_prefix_limit
from kvgate.router.core.warmup_claims import DONE_GRACE_SECONDS, FOLLOW_POLL_SECONDS, WarmClaim
from kvgate.router.http.replica_exchange import ReplicaExchange, SharedRedis
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
_MAX_PEER_REPLICAS = 64  # other replicas' counts read per pool
_FAILURES = (RedisError, OSError, TimeoutError, ValueError)


class WarmupSharer(ReplicaExchange):
    """The Redis side of shared warm-ups (see the module docstring)."""

    name = "warm-up sharing"
    task_name = "kvgate-warm-sharing"

    def __init__(
        self,
        core: RoutingCore,
        config: Callable[[], RouterConfig],
        metrics: RouterMetrics,
        dispatch: Callable[[], None],
        *,
        redis: SharedRedis | None = None,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`dispatch`: start sending the core's warm requests (the warmer's `dispatch`)."""
        super().__init__(core, config, metrics, redis=redis, replica=replica, clock=clock)
        self._dispatch = dispatch
        self._next_publish = float("-inf")
        self._ok = True  # no call of the current round failed

    def enabled(self, config: RouterConfig) -> bool:
        return config.warmup_sharing_enabled

    def interval(self, config: RouterConfig) -> float:
        return FOLLOW_POLL_SECONDS

    def delay(self, config: RouterConfig) -> float:
        # While a shared warm-up is under way, the next round is soon: it also times out the
        # pods past their deadline (`step` advances first) and reports the claimed ones.
        if self.core.warmup.claims.in_progress():
            return FOLLOW_POLL_SECONDS
        return max(0.0, self._next_publish - self._clock())

    def idle(self) -> None:
        """Sharing is off: nothing to tell the others (done marks dropped); pods waiting on a
        claim or a follow are warmed from this replica's own history, as without sharing."""
        claims = self.core.warmup.claims
        claims.take_reports()
        if claims.fail_pending(self._clock()):
            self._dispatch()

    def step_raised(self) -> None:
        # Nothing answers the claims and follows this round left open: warm those pods here.
        if self.core.warmup.claims.fail_pending(self._clock()):
            self._dispatch()

    async def step(self, config: RouterConfig) -> bool:
        """One round: claims, done marks, follows and (when due) publication; False if any
        call to Redis failed."""
        client = await self.redis.client(config.directory.redis)
        claims = self.core.warmup.claims
        self._ok = True
        claims.advance(self._clock())
        taken, reports = claims.take(), claims.take_reports()
        await asyncio.gather(
            *(self._claim(client, config, c) for c in taken),
            *(self._done(client, config, c) for c in reports),
        )
        followed: dict[str, list[WarmClaim]] = {}
        for c in claims.following():
            followed.setdefault(c.pool, []).append(c)
        await asyncio.gather(
            *(self._follow(client, config, pool, cs) for pool, cs in followed.items())
        )
        if taken or followed:
            self._dispatch()
        if self._clock() >= self._next_publish:
            await self._publish(client, config)
        return self._ok

    async def _call(
        self, config: RouterConfig, pool: str, operation: str, call: Awaitable[T]
    ) -> T | None:
        """`call`, bounded by the directory's per-call timeout; None if it failed."""
        try:
            async with asyncio.timeout(config.directory.redis.socket_timeout_seconds):
                return await call
        except Exception as exc:
            self._ok = False
            self.metrics.child(self.metrics.warm_sharing_errors, pool, operation).inc()
            if self._failures:  # logged when this run of failed rounds began
                log.debug("warm-up sharing: %s for %s failed: %r", operation, pool, exc)
            elif isinstance(exc, _FAILURES):
                log.warning("warm-up sharing: %s for %s failed: %r", operation, pool, exc)
            else:  # not Redis: a bug
                log.exception("warm-up sharing: %s for %s failed", operation, pool)
            return None

    async def _claim(self, client: Client, config: RouterConfig, claim: WarmClaim) -> None:
        call = self._claims_of(client, config, claim.pool).claim(
            claim.endpoint_id,
            claim.generation,
            self.replica,
            can_warm=claim.can_warm,
            ttl_seconds=config.warmup.timeout_seconds,
        )
        answer = await self._call(config, claim.pool, "claim", call)
        claims, now = self.core.warmup.claims, self._clock()
        if answer is None:
            claims.claim_result(claim, "failed", now)
            return
        outcome, replica = answer
        claims.claim_result(claim, outcome, now, warmed_by=replica)
        log.info("warm-up of %s: %s %s", claim.endpoint_id, outcome, replica)

    async def _done(self, client: Client, config: RouterConfig, claim: WarmClaim) -> None:
        call = self._claims_of(client, config, claim.pool).done(
            claim.endpoint_id, claim.generation, self.replica, grace_seconds=DONE_GRACE_SECONDS
        )
        if await self._call(config, claim.pool, "done", call) is None:
            # The followers wait for this mark: try again next round (backing off).
            self.core.warmup.claims.requeue_report(claim, self._clock())

    async def _follow(
        self, client: Client, config: RouterConfig, pool: str, followed: list[WarmClaim]
    ) -> None:
        call = self._claims_of(client, config, pool).states(
            [(c.endpoint_id, c.generation) for c in followed]
        )
        states = await self._call(config, pool, "follow", call)
        claims, now = self.core.warmup.claims, self._clock()
        for i, claim in enumerate(followed):
            claims.follow_result(claim, "failed" if states is None else states[i], now)

    async def _publish(self, client: Client, config: RouterConfig) -> None:
        """Publish every pool's hottest prefixes' counts; read the others' into the core."""
        warmup = self.core.warmup
        self._next_publish = self._clock() + config.warmup.share_interval_seconds
        limit = shared_prefix_limit(config.warmup)
        ttl = shared_counts_ttl_seconds(config.warmup)
        prefix = config.directory.redis.key_prefix

        async def one(pool: str) -> None:
            board = HotPrefixBoard(client, pool, key_prefix=prefix)
            mine = warmup.hot.shared_counts(pool, limit, self._clock())
            call = board.exchange(
                self.replica, mine, ttl_seconds=ttl, max_replicas=_MAX_PEER_REPLICAS
            )
            others = await self._call(config, pool, "publish", call)
            if others is not None:
                warmup.peer_counts.update(pool, others, self._clock())

        await asyncio.gather(*(one(pool) for pool in self.core.endpoints.pools()))

    @staticmethod
    def _claims_of(client: Client, config: RouterConfig, pool: str) -> RedisWarmClaims:
        # Made per call, not kept: a script object is its SHA1, and nothing outlives a client
        # or a pool removed by a reload.
        return RedisWarmClaims(client, pool, key_prefix=config.directory.redis.key_prefix)
