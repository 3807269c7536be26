"""Exchange this replica's load on each pod with the other router replicas, through Redis.

While sharing is on (`RouterConfig.load_sharing_enabled`: by default, whenever the directory is
Redis), every `load_sharing.interval_seconds` the background task takes this replica's own counts
(`core.accounting`: in flight, pending prefill requests and tokens, per pod), writes them to
each pool's load hash and reads the other replicas' in the same round trip
(`kvgate.directory.replica_load`), all pools at once, each bounded by `timeout_seconds`; the
others' counts go to `core.peers`, which every decision adds to its own. The request path only
reads that in-memory view: it never waits on Redis.

Redis down or slow: an exchange that fails or times out is counted
(`kvgate_router_load_sharing_errors_total`) and the view it would have refreshed ages out after
`ttl_seconds`, so the replica routes on its own counts (`kvgate_router_load_sharing_degraded`
= 1); retries back off to one a second and the first that answers restores sharing. The task
is owned: `stop()` cancels and awaits it and closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from kvgate.api.router_config import RedisConfig, RouterConfig
from kvgate.directory.factory import redis_connection
from kvgate.directory.redis import Client
from kvgate.directory.replica_load import PodLoad, ReplicaLoadBoard
from kvgate.router.core.accounting import EndpointLoad
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 1.0
_IDLE_CHECK_SECONDS = 1.0  # how often a replica with sharing off looks at its config again


def replica_id() -> str:
    """This process among the replicas: the pod's hostname, the pid and a random suffix."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{secrets.token_hex(3)}"


class LoadSharer:
    """The background side of `core/peer_load.py` (see the module docstring)."""

    def __init__(
        self,
        core: RoutingCore,
        config: Callable[[], RouterConfig],
        metrics: RouterMetrics,
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self._config = config
        self.metrics = metrics
        self.replica = replica or replica_id()
        self._clock = clock
        self._client: Client | None = None
        self._client_for: tuple[RedisConfig, float] | None = None  # (redis, timeout) made for
        self._boards: dict[str, ReplicaLoadBoard] = {}
        self._task: asyncio.Task[None] | None = None
        self._failures = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-load-sharing")

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
            config = self._config()
            sharing = config.load_sharing
            enabled = config.load_sharing_enabled
            if enabled != was_enabled:  # on at start, or a reload turned it on or off
                log.info("load sharing %s", "on" if enabled else "off")
                was_enabled = enabled
            if not enabled:
                # Nothing is shared, so nothing is stale; the view held ages out by itself.
                self.metrics.load_sharing_peers.set(0)
                self.metrics.load_sharing_degraded.set(0)
                await asyncio.sleep(_IDLE_CHECK_SECONDS)
                continue
            try:
                ok = await self.exchange_once()
            except Exception:  # a bug must not end sharing for the process's life
                log.exception("load sharing: exchange failed")
                ok = False
            self._failures = 0 if ok else self._failures + 1
            delay = sharing.interval_seconds
            if self._failures:
                delay = min(_MAX_BACKOFF_SECONDS, delay * 2**self._failures)
            await asyncio.sleep(delay)

    async def exchange_once(self) -> bool:
        """One exchange over every pool; False if any pool's failed."""
        config = self._config()
        sharing = config.load_sharing
        client = await self._redis(config)
        now = self._clock()
        endpoints = self.core.endpoints
        pools = {pool: [ep.id for ep in endpoints.in_pool(pool)] for pool in endpoints.pools()}

        async def one(pool: str, ids: list[str]) -> dict[str, dict[str, PodLoad]]:
            board = self._boards.get(pool)
            if board is None:
                board = self._boards[pool] = ReplicaLoadBoard(
                    client, pool, key_prefix=config.directory.redis.key_prefix
                )
            mine = dict(zip(ids, self.core.accounting.loads(ids, now), strict=True))
            async with asyncio.timeout(sharing.timeout_seconds):
                return await board.exchange(
                    self.replica,
                    mine,
                    ttl_seconds=sharing.ttl_seconds,
                    max_replicas=sharing.max_replicas,
                )

        results = await asyncio.gather(
            *(one(pool, ids) for pool, ids in pools.items()), return_exceptions=True
        )
        merged: dict[str, dict[str, EndpointLoad]] = {}
        failed = 0
        for (pool, ids), result in zip(pools.items(), results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, RedisError | OSError | TimeoutError):
                    raise result
                failed += 1
                self.metrics.child(self.metrics.load_sharing_errors, pool).inc()
                if self._failures == 0:
                    log.warning("load sharing: exchange for %s failed: %r", pool, result)
                continue
            known = set(ids)
            for replica, pods in result.items():
                view = merged.setdefault(replica, {})
                for pod, load in pods.items():
                    if pod in known:
                        view[pod] = EndpointLoad(*load)
        if failed < len(pools) or not pools:
            self.core.peers.update(merged, self._clock())
            if self._failures:
                log.info("load sharing: Redis answers again (%d replicas)", len(merged))
        self.metrics.load_sharing_peers.set(self.core.peers.replicas)
        self.metrics.load_sharing_degraded.set(0 if self.core.peers.fresh(self._clock()) else 1)
        return failed == 0

    async def _redis(self, config: RouterConfig) -> Client:
        # The directory's own connection (URL secret, TLS CA, cluster), with this task's timeout.
        made_for = (config.directory.redis, config.load_sharing.timeout_seconds)
        if self._client is not None and self._client_for != made_for:  # reloaded
            await self._client.aclose()
            self._client, self._boards = None, {}
        if self._client is None:
            self._client = redis_connection(made_for[0]).client(made_for[1])
            self._client_for = made_for
        return self._client
