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
to one a second. The task is owned: `stop()` cancels and awaits it and closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError

from kvgate.api.router_config import RedisConfig, RouterConfig
from kvgate.directory.factory import redis_connection
from kvgate.directory.redis import Client
from kvgate.directory.shared_warmup import HotPrefixBoard, RedisWarmClaims
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.core.peer_prefixes import shared_counts_ttl_seconds, shared_prefix_limit
from kvgate.router.core.warmup_claims import DONE_GRACE_SECONDS, FOLLOW_POLL_SECONDS, WarmClaim
from kvgate.router.http.load_sharing import replica_id
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
_IDLE_CHECK_SECONDS = 1.0  # how often a replica with sharing off looks at its config again
_MAX_BACKOFF_SECONDS = 1.0
_MAX_PEER_REPLICAS = 64  # other replicas' counts read per pool
_FAILURES = (RedisError, OSError, TimeoutError, ValueError)


class WarmupSharer:
    """The Redis side of shared warm-ups (see the module docstring)."""

    def __init__(
        self,
        core: RoutingCore,
        config: Callable[[], RouterConfig],
        metrics: RouterMetrics,
        dispatch: Callable[[], None],
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`dispatch`: start sending the core's warm requests (the warmer's `dispatch`)."""
        self.core = core
        self._config = config
        self.metrics = metrics
        self._dispatch = dispatch
        self.replica = replica or replica_id()
        self._clock = clock
        self._client: Client | None = None
        self._client_for: RedisConfig | None = None
        self._claims: dict[str, RedisWarmClaims] = {}
        self._boards: dict[str, HotPrefixBoard] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._next_publish = float("-inf")
        self._failures = 0
        self._ok = True  # no call of the current round failed

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-warm-sharing")

    def wake(self) -> None:
        """Pods joined: claim them now rather than at the next round."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        was_enabled = False
        while True:
            self._wake.clear()  # a join while this round talks to Redis wakes the next one
            config = self._config()
            enabled = config.warmup_sharing_enabled
            if enabled != was_enabled:  # on at start, or a reload turned it on or off
                log.info("warm-up sharing %s", "on" if enabled else "off")
                was_enabled = enabled
            if not enabled:
                self._fail_pending(drop_reports=True)
                delay = _IDLE_CHECK_SECONDS
            else:
                try:
                    ok = await self.step()
                except Exception:  # a bug must not end sharing for the process's life
                    log.exception("warm-up sharing: step failed")
                    self._fail_pending(drop_reports=False)
                    ok = False
                self._failures = 0 if ok else self._failures + 1
                delay = self._delay()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _delay(self) -> float:
        if self._failures:
            return min(_MAX_BACKOFF_SECONDS, FOLLOW_POLL_SECONDS * 2.0**self._failures)
        # While a shared warm-up is under way, the next round is soon: it also times out the
        # pods past their deadline (`step` advances first) and reports the claimed ones.
        if self.core.warmup.claims.in_progress():
            return FOLLOW_POLL_SECONDS
        return max(0.0, self._next_publish - self._clock())

    def _fail_pending(self, *, drop_reports: bool) -> None:
        """Redis cannot be asked (sharing turned off, a round failed): pods waiting on a claim
        or a follow are warmed from this replica's own history, as without sharing; with sharing
        off, nothing is told to the others (done marks dropped)."""
        claims = self.core.warmup.claims
        if drop_reports:
            claims.take_reports()
        if claims.fail_pending(self._clock()):
            self._dispatch()

    async def step(self) -> bool:
        """One round: claims, done marks, follows and (when due) publication; False if any
        call to Redis failed."""
        config = self._config()
        client = await self._redis(config)
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
            if not isinstance(exc, _FAILURES):
                log.exception("warm-up sharing: %s for %s failed", operation, pool)
            elif self._failures == 0:
                log.warning("warm-up sharing: %s for %s failed: %r", operation, pool, exc)
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

        async def one(pool: str) -> None:
            board = self._boards.get(pool)
            if board is None:
                prefix = config.directory.redis.key_prefix
                board = self._boards[pool] = HotPrefixBoard(client, pool, key_prefix=prefix)
            mine = warmup.hot.shared_counts(pool, limit, self._clock())
            call = board.exchange(
                self.replica, mine, ttl_seconds=ttl, max_replicas=_MAX_PEER_REPLICAS
            )
            others = await self._call(config, pool, "publish", call)
            if others is not None:
                warmup.peer_counts.update(pool, others, self._clock())

        await asyncio.gather(*(one(pool) for pool in self.core.endpoints.pools()))

    def _claims_of(self, client: Client, config: RouterConfig, pool: str) -> RedisWarmClaims:
        board = self._claims.get(pool)
        if board is None:
            prefix = config.directory.redis.key_prefix
            board = self._claims[pool] = RedisWarmClaims(client, pool, key_prefix=prefix)
        return board

    async def _redis(self, config: RouterConfig) -> Client:
        # The directory's own connection (URL secret, TLS CA, cluster) and per-call timeout.
        redis = config.directory.redis
        if self._client is not None and self._client_for != redis:  # reloaded
            await self._client.aclose()
            self._client, self._claims, self._boards = None, {}, {}
        if self._client is None:
            self._client = redis_connection(redis).client(redis.socket_timeout_seconds)
            self._client_for = redis
        return self._client
