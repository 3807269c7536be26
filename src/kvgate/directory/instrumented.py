"""A `BlockIndex` decorator that adds Prometheus metrics, so backends stay free of them.

Every call is timed (`kvgate_directory_operation_duration_seconds`) and counted by outcome
(`kvgate_directory_operations_total`: ok, stale for a write refused as a stale generation,
error when the backend raised; the exception still propagates). Lookups also record the
longest match; writes count the keys written; `stats()` refreshes the size gauges.

The pool is fixed per index, so every labelled child is resolved once, here: `labels()` costs
about three times the update itself, and `lookup` is on the router's per-request path. The
counters therefore start at 0 when the index is created (Prometheus' `rate()` misses the first
increment of a series that appears above 0).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection, Sequence
from typing import TypeVar

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.prefix import BlockKey

T = TypeVar("T")

_WRITES = ("add", "remove", "add_approximate")
"""Operations that write block keys (counted in `kvgate_directory_blocks_written_total`)."""
_OPERATIONS = (
    "lookup",
    *_WRITES,
    "clear_pod",
    "forget_pod",
    "set_generation",
    "get_generation",
    "owner_silent",
    "pods",
    "audit",
    "stats",
)


class InstrumentedBlockIndex:
    """Wraps any `BlockIndex`; behaves exactly like it."""

    def __init__(self, inner: BlockIndex, metrics: DirectoryMetrics, pool: str) -> None:
        self.inner = inner
        self._metrics = metrics
        self._pool = pool
        self._seconds = {op: metrics.operation_seconds.labels(pool, op) for op in _OPERATIONS}
        outcomes = [(op, "ok") for op in _OPERATIONS] + [(op, "error") for op in _OPERATIONS]
        outcomes += [("add", "stale"), ("remove", "stale")]
        self._outcomes = {key: metrics.operations.labels(pool, *key) for key in outcomes}
        self._written = {op: metrics.blocks_written.labels(pool, op) for op in _WRITES}
        self._matched = metrics.lookup_matched_blocks.labels(pool)

    async def _observe(self, operation: str, call: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            result = await call
        except Exception:
            self._outcomes[operation, "error"].inc()
            raise
        finally:
            self._seconds[operation].observe(time.perf_counter() - start)
        outcome = "stale" if result is False and operation in ("add", "remove") else "ok"
        self._outcomes[operation, outcome].inc()
        return result

    async def _write(self, operation: str, keys: Sequence[BlockKey], call: Awaitable[T]) -> T:
        """`_observe`, then count the keys written unless the write was refused (False)."""
        result = await self._observe(operation, call)
        if result is not False:
            self._written[operation].inc(len(keys))
        return result

    async def lookup(
        self,
        keys: Sequence[BlockKey],
        pods: Collection[str] | None = None,
        *,
        medium: str | None = None,
    ) -> dict[str, int]:
        result = await self._observe("lookup", self.inner.lookup(keys, pods, medium=medium))
        if medium is None:  # a tier's share of a match is not another match
            self._matched.observe(max(result.values(), default=0))
        return result

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        return await self._write(
            "add", keys, self.inner.add(pod, keys, medium=medium, generation=generation)
        )

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        return await self._write(
            "remove", keys, self.inner.remove(pod, keys, medium=medium, generation=generation)
        )

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        await self._write(
            "add_approximate", keys, self.inner.add_approximate(pod, keys, ttl_seconds)
        )

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        await self._observe("clear_pod", self.inner.clear_pod(pod, generation=generation))

    async def forget_pod(self, pod: str) -> None:
        await self._observe("forget_pod", self.inner.forget_pod(pod))

    async def set_generation(self, pod: str, generation: str) -> bool:
        return await self._observe("set_generation", self.inner.set_generation(pod, generation))

    async def get_generation(self, pod: str) -> str | None:
        return await self._observe("get_generation", self.inner.get_generation(pod))

    async def owner_silent(self, pod: str, generation: str, seconds: float) -> bool:
        return await self._observe(
            "owner_silent", self.inner.owner_silent(pod, generation, seconds)
        )

    async def pods(self) -> set[str]:
        return await self._observe("pods", self.inner.pods())

    async def audit(self, pods: Collection[str]) -> tuple[str, set[str]]:
        return await self._observe("audit", self.inner.audit(pods))

    async def stats(self) -> IndexStats:
        stats = await self._observe("stats", self.inner.stats())
        self._metrics.pods.labels(self._pool).set(stats.pods)
        self._metrics.entries.labels(self._pool, "exact").set(stats.entries)
        self._metrics.entries.labels(self._pool, "approximate").set(stats.approximate_entries)
        return stats

    async def close(self) -> None:
        await self.inner.close()
