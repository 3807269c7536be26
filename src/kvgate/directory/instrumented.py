"""A `BlockIndex` decorator that adds Prometheus metrics, so backends stay free of them.

Every call is timed (`kvgate_directory_operation_duration_seconds`) and counted by outcome
(`kvgate_directory_operations_total`: ok, stale for a write refused as a stale generation,
error when the backend raised; the exception still propagates). Lookups also record the
longest match; writes count the keys written; `stats()` refreshes the size gauges.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection, Sequence
from typing import TypeVar

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.prefix import BlockKey

T = TypeVar("T")


class InstrumentedBlockIndex:
    """Wraps any `BlockIndex`; behaves exactly like it."""

    def __init__(self, inner: BlockIndex, metrics: DirectoryMetrics, pool: str) -> None:
        self.inner = inner
        self._metrics = metrics
        self._pool = pool

    async def _observe(self, operation: str, call: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            result = await call
        except Exception:
            self._metrics.operations.labels(self._pool, operation, "error").inc()
            raise
        finally:
            self._metrics.operation_seconds.labels(self._pool, operation).observe(
                time.perf_counter() - start
            )
        outcome = "stale" if result is False and operation in ("add", "remove") else "ok"
        self._metrics.operations.labels(self._pool, operation, outcome).inc()
        return result

    async def lookup(
        self, keys: Sequence[BlockKey], pods: Collection[str] | None = None
    ) -> dict[str, int]:
        result = await self._observe("lookup", self.inner.lookup(keys, pods))
        self._metrics.lookup_matched_blocks.labels(self._pool).observe(
            max(result.values(), default=0)
        )
        return result

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        applied = await self._observe(
            "add", self.inner.add(pod, keys, medium=medium, generation=generation)
        )
        if applied:
            self._metrics.blocks_written.labels(self._pool, "add").inc(len(keys))
        return applied

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        applied = await self._observe(
            "remove", self.inner.remove(pod, keys, medium=medium, generation=generation)
        )
        if applied:
            self._metrics.blocks_written.labels(self._pool, "remove").inc(len(keys))
        return applied

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        await self._observe("add_approximate", self.inner.add_approximate(pod, keys, ttl_seconds))
        self._metrics.blocks_written.labels(self._pool, "add_approximate").inc(len(keys))

    async def clear_pod(self, pod: str) -> None:
        await self._observe("clear_pod", self.inner.clear_pod(pod))

    async def forget_pod(self, pod: str) -> None:
        await self._observe("forget_pod", self.inner.forget_pod(pod))

    async def set_generation(self, pod: str, generation: str) -> bool:
        return await self._observe("set_generation", self.inner.set_generation(pod, generation))

    async def get_generation(self, pod: str) -> str | None:
        return await self._observe("get_generation", self.inner.get_generation(pod))

    async def pods(self) -> set[str]:
        return await self._observe("pods", self.inner.pods())

    async def stats(self) -> IndexStats:
        stats = await self._observe("stats", self.inner.stats())
        self._metrics.pods.labels(self._pool).set(stats.pods)
        self._metrics.entries.labels(self._pool, "exact").set(stats.entries)
        self._metrics.entries.labels(self._pool, "approximate").set(stats.approximate_entries)
        return stats

    async def close(self) -> None:
        await self.inner.close()
