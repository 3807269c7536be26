"""The indexer: KV-event subscriptions for every ready pod, following discovery.

One `kvgate.directory.SubscriptionManager` per pool feeds that pool's index. Whenever the
endpoint set changes, each touched pool's manager is reconciled with the pool's endpoints that
publish KV events (with the topic each pod publishes under, exactly); the manager subscribes to new pods, resubscribes pods whose endpoints or
generation changed, and stops and forgets pods that left. The same class runs embedded in the
router and alone in `kvgate indexer` (writing to Redis for many routers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from kvgate.api.router_config import EngineConfig, KvEventsConfig
from kvgate.directory.base import BlockIndex
from kvgate.directory.indexer import SubscriptionManager
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.subscriber import PodEndpoint
from kvgate.discovery.endpoints import Endpoint, EndpointSet

log = logging.getLogger(__name__)


async def refresh_directory_stats(indexes: Mapping[str, BlockIndex], interval: float) -> None:
    """Forever: ask every index for its size, which sets the `kvgate_directory_pods` and
    `kvgate_directory_entries` gauges (the instrumented index updates them on `stats()`)."""
    while True:
        for pool, index in list(indexes.items()):
            try:
                await index.stats()
            except Exception as exc:  # Redis down: the gauges keep their last value
                log.debug("directory stats of %s unavailable: %r", pool, exc)
        await asyncio.sleep(interval)


class EventIndexer:
    def __init__(
        self,
        endpoints: EndpointSet,
        indexes: Mapping[str, BlockIndex],
        metrics: DirectoryMetrics | None = None,
        limits: KvEventsConfig | None = None,
        engine_of: Callable[[str], EngineConfig | None] = lambda pool: None,
    ) -> None:
        """`engine_of(pool)`: the pool's engine settings (read at each `sync_pool`): whether a
        CPU offloading tier's events are indexed (`cpu_offload`), and the block size its events
        must have (`block_size`)."""
        self._endpoints = endpoints
        self._indexes = indexes
        self._metrics = metrics
        self._limits = limits
        self._engine_of = engine_of
        self._managers: dict[str, SubscriptionManager] = {}

    def subscribed(self, pool: str) -> set[str]:
        manager = self._managers.get(pool)
        return set(manager.endpoints) if manager else set()

    async def endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for pool in {ep.pool for ep in (*added, *removed)}:
            await self.sync_pool(pool)

    async def sync_pool(self, pool: str) -> None:
        index = self._indexes.get(pool)
        manager = self._managers.get(pool)
        eps = self._endpoints.in_pool(pool)
        if index is None or not eps:
            if manager is not None:
                await manager.reconcile([])
                await manager.close()
                del self._managers[pool]
            return
        engine = self._engine_of(pool)
        offload_tier = engine is not None and engine.cpu_offload
        block_size = None if engine is None else engine.block_size
        if manager is None:
            manager = SubscriptionManager(
                index,
                pool=pool,
                metrics=self._metrics,
                limits=self._limits,
                offload_tier=offload_tier,
                block_size=block_size,
            )
            self._managers[pool] = manager
        else:  # a reload may have changed them: the pool's pods restart with the new settings
            manager.configure(offload_tier=offload_tier, block_size=block_size)
        await manager.reconcile(
            PodEndpoint(
                pod=ep.id,
                events=ep.spec.kv_events,
                replay=ep.spec.kv_replay,
                topic=ep.spec.kv_topic,
                generation=ep.spec.generation,
            )
            for ep in eps
            if ep.spec.kv_events is not None
        )

    async def close(self) -> None:
        for manager in self._managers.values():
            await manager.close()
        self._managers.clear()
