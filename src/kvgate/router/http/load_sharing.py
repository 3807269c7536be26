"""Exchange this replica's load on each pod with the other router replicas, through Redis.

While sharing is on (`RouterConfig.load_sharing_enabled`: by default, whenever the directory is
Redis), every `load_sharing.interval_seconds` the background task takes this replica's own counts
(`core.accounting`: in flight, pending prefill requests and tokens, and batch requests in
flight, per pod), writes them to each pool's load hash and reads the other replicas' in the same
round trip (`kvgate.directory.replica_load`), all pools at once, each bounded by
`timeout_seconds`; the others' counts go to `core.peers`, which every decision adds to its own.
The request path only reads that in-memory view: it never waits on Redis.

Redis down or slow: an exchange that fails or times out is counted
(`kvgate_router_load_sharing_errors_total`) and the view it would have refreshed ages out after
`ttl_seconds`, so the replica routes on its own counts (`kvgate_router_load_sharing_degraded`
= 1); retries back off to one a second and the first that answers restores sharing. The task
and the Redis client it shares with `warm_sharing.py` are `replica_exchange.py`'s.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from kvgate.api.router_config import RouterConfig
from kvgate.directory.replica_load import PodLoad, ReplicaLoadBoard
from kvgate.router.core.accounting import EndpointLoad
from kvgate.router.http.replica_exchange import ReplicaExchange

log = logging.getLogger(__name__)


class LoadSharer(ReplicaExchange):
    """The background side of `core/peer_load.py` (see the module docstring)."""

    name = "load sharing"
    task_name = "kvgate-load-sharing"

    def enabled(self, config: RouterConfig) -> bool:
        return config.load_sharing_enabled

    def interval(self, config: RouterConfig) -> float:
        return config.load_sharing.interval_seconds

    def idle(self) -> None:
        # Nothing is shared, so nothing is stale; the view held ages out by itself.
        self.metrics.load_sharing_peers.set(0)
        self.metrics.load_sharing_degraded.set(0)

    async def step(self, config: RouterConfig) -> bool:
        return await self.exchange_once(config)

    async def exchange_once(self, config: RouterConfig) -> bool:
        """One exchange over every pool; False if any pool's failed."""
        sharing = config.load_sharing
        client = await self.redis.client(config.directory.redis)
        now = self._clock()
        endpoints = self.core.endpoints
        pools = {pool: [ep.id for ep in endpoints.in_pool(pool)] for pool in endpoints.pools()}

        async def one(pool: str, ids: list[str]) -> dict[str, dict[str, PodLoad]]:
            # Made per round, not kept: a script object is its SHA1, and nothing outlives a
            # client or a pool removed by a reload.
            board = ReplicaLoadBoard(client, pool, key_prefix=config.directory.redis.key_prefix)
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
        for pool, result in zip(pools, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, RedisError | OSError | TimeoutError):
                    raise result
                failed += 1
                self.metrics.child(self.metrics.load_sharing_errors, pool).inc()
                if self._failures == 0:
                    log.warning("load sharing: exchange for %s failed: %r", pool, result)
                continue
            for replica, pods in result.items():  # the loads of this pool's pods only
                view = merged.setdefault(replica, {})
                for pod, load in pods.items():
                    view[pod] = EndpointLoad(*load)
        if failed < len(pools) or not pools:
            self.core.peers.update(merged, self._clock())
        self.metrics.load_sharing_peers.set(self.core.peers.replicas)
        self.metrics.load_sharing_degraded.set(0 if self.core.peers.fresh(self._clock()) else 1)
        return failed == 0
