"""A shared (Redis) directory with a local fallback: losing Redis never fails a request.

`FallbackIndex` writes every update to a local in-memory index and to the shared one. Lookups
go to the shared index (which also holds what other routers and `kvgate indexer` wrote). A failed
lookup is answered from the local view; after `failures_to_degrade` failures in a row, or any
lost write, the index turns *degraded*: lookups use the local view without asking Redis, it is
counted (`kvgate_directory_fallback_errors_total`, `kvgate_directory_fallback_degraded`), and the
pods whose shared writes were lost are remembered. At most every `resync_interval` a degraded
index probes the shared one; when it answers, the remembered pods are cleared there (their
shared entries may have missed removals, and a missing entry costs a cache miss while a stale one
misroutes), and lookups go back to the shared index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TypeVar

from prometheus_client import Counter, Gauge

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats
from kvgate.prefix.hashing import BlockKey

log = logging.getLogger(__name__)
T = TypeVar("T")


class FallbackIndex:
    def __init__(
        self,
        shared: BlockIndex,
        local: BlockIndex,
        errors: Counter,
        degraded: Gauge,
        *,
        resync_interval: float = 1.0,
        failures_to_degrade: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.local = local
        self._errors = errors  # labelled by operation
        self._degraded = degraded
        self._interval = resync_interval
        self._clock = clock
        self.degraded = False
        self.failures_to_degrade = failures_to_degrade
        self._failures = 0
        self._last_probe = 0.0
        self._dirty: set[str] = set()

    async def _shared(self, operation: str, call: Awaitable[T], pod: str | None) -> T | None:
        try:
            result = await call
        except Exception as exc:
            self._errors.labels(operation).inc()
            if pod is not None:
                self._dirty.add(pod)
            self._failures += 1
            # One slow answer is not an outage: degrade after a few failures in a row, or at
            # once when a write was lost (the shared index no longer matches the local view).
            if not self.degraded and (
                pod is not None or self._failures >= self.failures_to_degrade
            ):
                log.warning(
                    "shared directory failed (%s: %r); routing on the local view", operation, exc
                )
                self.degraded = True
                self._degraded.set(1)
            self._last_probe = self._clock()
            return None
        self._failures = 0
        return result

    async def _maybe_recover(self) -> None:
        now = self._clock()
        if now - self._last_probe < self._interval:
            return
        self._last_probe = now
        try:
            for pod in sorted(self._dirty):
                await self.shared.clear_pod(pod)
                self._dirty.discard(pod)
        except Exception:
            self._errors.labels("resync").inc()
            return
        self.degraded = False
        self._degraded.set(0)
        log.info("shared directory is back; resynchronised")

    async def lookup(
        self, keys: Sequence[BlockKey], pods: Collection[str] | None = None
    ) -> dict[str, int]:
        if self.degraded:
            await self._maybe_recover()
        if not self.degraded:
            found = await self._shared("lookup", self.shared.lookup(keys, pods), None)
            if found is not None:
                return found
        return await self.local.lookup(keys, pods)

    async def _write(
        self, operation: str, pod: str, local: Awaitable[T], shared: Awaitable[T]
    ) -> T:
        result = await local
        if self.degraded:
            self._dirty.add(pod)
            close = getattr(shared, "close", None)
            if close is not None:
                close()
            return result
        await self._shared(operation, shared, pod)
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
            "add",
            pod,
            self.local.add(pod, keys, medium=medium, generation=generation),
            self.shared.add(pod, keys, medium=medium, generation=generation),
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
            "remove",
            pod,
            self.local.remove(pod, keys, medium=medium, generation=generation),
            self.shared.remove(pod, keys, medium=medium, generation=generation),
        )

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        await self._write(
            "add_approximate",
            pod,
            self.local.add_approximate(pod, keys, ttl_seconds),
            self.shared.add_approximate(pod, keys, ttl_seconds),
        )

    async def clear_pod(self, pod: str) -> None:
        await self._write("clear_pod", pod, self.local.clear_pod(pod), self.shared.clear_pod(pod))

    async def forget_pod(self, pod: str) -> None:
        await self._write(
            "forget_pod", pod, self.local.forget_pod(pod), self.shared.forget_pod(pod)
        )

    async def set_generation(self, pod: str, generation: str) -> bool:
        return await self._write(
            "set_generation",
            pod,
            self.local.set_generation(pod, generation),
            self.shared.set_generation(pod, generation),
        )

    async def get_generation(self, pod: str) -> str | None:
        if not self.degraded:
            found = await self._shared("get_generation", self.shared.get_generation(pod), None)
            if found is not None or not self.degraded:
                return found
        return await self.local.get_generation(pod)

    async def pods(self) -> set[str]:
        if not self.degraded:
            found = await self._shared("pods", self.shared.pods(), None)
            if found is not None:
                return found
        return await self.local.pods()

    async def stats(self) -> IndexStats:
        if not self.degraded:
            found = await self._shared("stats", self.shared.stats(), None)
            if found is not None:
                return found
        return await self.local.stats()

    async def close(self) -> None:
        await self.local.close()
        try:
            await self.shared.close()
        except Exception as exc:
            log.warning("closing the shared directory failed: %r", exc)
