"""Keep one KV-event subscription per pod of a pool, as the set of pods changes.

`reconcile(endpoints)` is declarative: the caller (the router's discovery, or `kvgate indexer`)
passes every ready pod it knows with its endpoints; the manager starts subscriptions for new
pods, restarts those whose endpoints or generation changed, and stops those that are gone. A
pod that goes away, or whose endpoints change (a new pod IP means a new engine), is forgotten
in the directory once its subscription has stopped, so no late event can re-add its blocks.

Every subscription is an asyncio task owned here; `close()` cancels and awaits all of them.
A subscription that crashes (a bug) is logged and restarted after a back-off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import zmq.asyncio

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.base import BlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.subscriber import PodEndpoint, PodSubscriber

log = logging.getLogger(__name__)


class SubscriptionManager:
    """KV-event subscriptions of one pool's pods, feeding one `BlockIndex`."""

    def __init__(
        self,
        index: BlockIndex,
        *,
        pool: str = "",
        metrics: DirectoryMetrics | None = None,
        limits: KvEventsConfig | None = None,
        kv_cache_group: int | None = 0,
        offload_tier: bool = False,
        block_size: int | None = None,
        restart_backoff_seconds: float = 1.0,
    ) -> None:
        self._index = index
        self._pool = pool
        self._metrics = metrics
        self._limits = limits
        self._group = kv_cache_group
        self._offload_tier = offload_tier
        self._block_size = block_size
        self._backoff = restart_backoff_seconds
        self._context = zmq.asyncio.Context()
        self._subscribers: dict[str, PodSubscriber] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    def configure(self, *, offload_tier: bool, block_size: int | None) -> None:
        """The pool's engine settings changed (a reload): every subscription applies them to
        the events it reads from now on."""
        self._offload_tier, self._block_size = offload_tier, block_size
        for sub in self._subscribers.values():
            sub.configure(offload_tier=offload_tier, block_size=block_size)

    @property
    def endpoints(self) -> dict[str, PodEndpoint]:
        return {pod: sub.endpoint for pod, sub in self._subscribers.items()}

    def subscriber(self, pod: str) -> PodSubscriber | None:
        return self._subscribers.get(pod)

    async def reconcile(self, endpoints: Iterable[PodEndpoint]) -> None:
        """Make the running subscriptions exactly `endpoints` (one per pod id)."""
        desired = {e.pod: e for e in endpoints}
        async with self._lock:
            if self._closed:
                raise RuntimeError("SubscriptionManager is closed")
            for pod, sub in list(self._subscribers.items()):
                if desired.get(pod) != sub.endpoint:
                    await self._stop(pod)
                    await self._index.forget_pod(pod)
                    if self._metrics:
                        self._metrics.pod_clears.labels(self._pool, "removed").inc()
            for pod, endpoint in desired.items():
                if pod not in self._subscribers:
                    self._start(endpoint)
            self._set_gauge()

    async def close(self) -> None:
        """Stop every subscription (the directory keeps their entries)."""
        async with self._lock:
            self._closed = True
            for pod in list(self._subscribers):
                await self._stop(pod)
            self._set_gauge()
            self._context.destroy(linger=0)

    def _start(self, endpoint: PodEndpoint) -> None:
        sub = PodSubscriber(
            endpoint,
            self._index,
            self._context,
            pool=self._pool,
            metrics=self._metrics,
            limits=self._limits,
            kv_cache_group=self._group,
            offload_tier=self._offload_tier,
            block_size=self._block_size,
        )
        self._subscribers[endpoint.pod] = sub
        self._tasks[endpoint.pod] = asyncio.create_task(
            self._supervise(sub), name=f"kv-events:{endpoint.pod}"
        )

    async def _supervise(self, sub: PodSubscriber) -> None:
        while True:
            try:
                await sub.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kv-event subscription of %s crashed; restarting", sub.endpoint.pod)
                await asyncio.sleep(self._backoff)

    async def _stop(self, pod: str) -> None:
        self._subscribers.pop(pod, None)
        task = self._tasks.pop(pod, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _set_gauge(self) -> None:
        if self._metrics:
            self._metrics.subscriptions.labels(self._pool).set(len(self._tasks))
