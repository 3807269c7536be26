"""Assemble the router's parts from a config, own their background tasks, and reload.

`RouterRuntime` owns: the routing core (`core/lifecycle.py`: decisions, endpoint accounting and
learning), the HTTP client to the pods (pooled keep-alive connections, `http/upstream.py`), the
proxy, the warmer of pods that join (`http/warmer.py`), the load and warm-up exchanges with
the other router replicas (`http/load_sharing.py`, `http/warm_sharing.py`, over one Redis
client, `http/replica_exchange.py`), one directory index per pool, the endpoint set fed by
discovery, the load scraper, the embedded indexer (KV-event subscriptions, `kvgate.indexer`)
and the config-file watcher. `start()` starts them; `stop()` cancels and awaits every task and
closes every connection, each producer before what it feeds (the warm-up exchange hands warm
requests to the warmer: it stops first).

Reload: a new config builds a new `RouterState` (classifier, keyers, policy) and swaps it in
atomically; requests already in flight keep the state they started with. Pools that remain keep
their directory and endpoints; new pools get them; removed pools are dropped, their pods
forgotten, and so are their hot prefixes (`core.pool_removed`). A config that fails to load or
validate leaves the old one in place (counted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from kvgate.api.router_config import EngineConfig, PoolConfig, RouterConfig, load_router_config
from kvgate.directory.base import BlockIndex
from kvgate.directory.factory import create_pool_index
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.discovery import Discovery, build_discovery
from kvgate.discovery.endpoints import Endpoint, EndpointSet
from kvgate.indexer.subscriptions import EventIndexer, refresh_directory_stats
from kvgate.router.core.keys import Keyer, keyer_identity
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.core.routing import RouterState
from kvgate.router.http.load_sharing import LoadSharer
from kvgate.router.http.proxy import Proxy
from kvgate.router.http.replica_exchange import SharedRedis
from kvgate.router.http.scrape import LoadScraper
from kvgate.router.http.upstream import HttpxUpstream, RawUpstream, RoutingUpstream, Upstream
from kvgate.router.http.warm_sharing import WarmupSharer
from kvgate.router.http.warmer import Warmer
from kvgate.router.metrics import RouterMetrics
from kvgate.router.setup import build_keyer
from kvgate.scoring.registry import build_policy
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def build_state(
    config: RouterConfig, keyers: dict[tuple[Any, ...], Keyer] | None = None
) -> RouterState:
    """Everything the config determines that is pure; raises ValueError on a bad config.

    `keyers` carries keyers (tokenizer, hash caches) over reloads: pools whose engine settings
    did not change keep theirs, warm."""
    cache = keyers if keyers is not None else {}

    def keyer(pool: PoolConfig) -> Keyer:
        ident = keyer_identity(pool.engine)
        found = cache.get(ident)
        if found is None:
            found = cache[ident] = build_keyer(pool)
        return found

    policy = config.policy
    cap = policy.max_affinity_wait_seconds
    built = build_policy(policy.name, policy.params, max_affinity_wait_seconds=cap)
    state = RouterState(config, built, keyer)
    live = {keyer_identity(p.engine) for p in config.pools}
    for ident in list(cache):
        if ident not in live:
            del cache[ident]
    return state


class RouterRuntime:
    def __init__(
        self,
        config: RouterConfig,
        *,
        config_path: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        reload_check_seconds: float = 1.0,
        stats_interval_seconds: float = 5.0,
    ) -> None:
        self.metrics = metrics or RouterMetrics()
        self.config_path = config_path
        self._reload_check_seconds = reload_check_seconds
        self._stats_interval_seconds = stats_interval_seconds
        self._keyers: dict[tuple[Any, ...], Keyer] = {}
        state = build_state(config, self._keyers)
        limits = config.limits
        # httpx serves tests (an injected transport) and https pods; plain http goes raw.
        self.client = httpx.AsyncClient(
            transport=transport,
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=limits.max_connections_per_endpoint,
            ),
        )
        fallback = HttpxUpstream(self.client)
        self.upstream: Upstream = (
            fallback
            if transport is not None
            else RoutingUpstream(RawUpstream(limits.max_connections_per_endpoint), fallback)
        )
        self.endpoints = EndpointSet(clock)
        self.indexes: dict[str, BlockIndex] = {}
        self.directory_metrics = DirectoryMetrics(self.metrics.registry)
        self.core = RoutingCore(
            state,
            self.endpoints,
            self.indexes,
            self.metrics,
            self.directory_metrics.fallback_errors,
            clock=clock,
        )
        self.proxy = Proxy(self.upstream, self.core, limits)
        self.warmer = Warmer(self.core, self.upstream, lambda: self.config.limits, clock=clock)
        self.core.warm_requests_ready = self.warmer.dispatch
        self.replica_redis = SharedRedis()  # one client for both exchanges with the replicas
        self.load_sharer = LoadSharer(
            self.core, lambda: self.config, self.metrics, redis=self.replica_redis, clock=clock
        )
        self.warm_sharer = WarmupSharer(
            self.core,
            lambda: self.config,
            self.metrics,
            self.warmer.dispatch,
            redis=self.replica_redis,
            replica=self.load_sharer.replica,
            clock=clock,
        )
        self.scraper = LoadScraper(
            self.endpoints,
            self.upstream,
            self.core,
            interval=config.load_metrics.scrape_interval_seconds,
            timeout=config.load_metrics.scrape_timeout_seconds,
            path=config.load_metrics.path,
            max_page_bytes=config.load_metrics.max_page_bytes,
            clock=clock,
        )
        self.discoveries: dict[str, Discovery] = {}
        self.endpoints.add_listener(self._endpoints_changed)
        self.indexer = (
            EventIndexer(
                self.endpoints,
                self.indexes,
                self.directory_metrics,
                config.directory.kv_events,
                engine_of=self._engine_of,
            )
            if config.directory.embedded_indexer
            else None
        )
        self._watch_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self.started = False

    @property
    def config(self) -> RouterConfig:
        return self.core.state.config

    def _engine_of(self, pool: str) -> EngineConfig | None:
        config = self.core.state.pools.get(pool)
        return None if config is None else config.engine

    async def start(self) -> None:
        await self._sync_pools(self.config)
        self.scraper.start()
        self.load_sharer.start()
        self.warm_sharer.start()
        self._stats_task = asyncio.create_task(
            refresh_directory_stats(self.indexes, self._stats_interval_seconds),
            name="kvgate-directory-stats",
        )
        if self.config_path is not None:
            # The file as loaded is the baseline: a change from now on is a reload.
            baseline = _stat_key(Path(self.config_path))
            self._watch_task = asyncio.create_task(
                self._watch_config(baseline, self._reload_check_seconds), name="kvgate-config"
            )
        self.started = True

    async def stop(self) -> None:
        await cancel_and_wait(self._watch_task, self._stats_task)
        for discovery in self.discoveries.values():
            await discovery.stop()
        if self.indexer is not None:
            await self.indexer.close()
        await self.scraper.stop()
        await self.warm_sharer.stop()  # before the warmer: it dispatches warm requests
        await self.warmer.stop()
        await self.load_sharer.stop()
        await self.replica_redis.aclose()
        for index in self.indexes.values():
            await index.close()
        await self.upstream.aclose()
        self.core.router.keying.close()
        self.started = False

    def ready(self) -> bool:
        """At least one endpoint is in rotation."""
        now = time.monotonic()
        return self.started and any(ep.healthy(now) for ep in self.endpoints.all())

    async def reload(self, config: RouterConfig) -> None:
        """Swap in a new configuration (see the module docstring). Raises ValueError."""
        keyers = dict(self._keyers)  # a failed reload leaves the running keyers untouched
        state = build_state(config, keyers)
        self._keyers = keyers
        self.core.reconfigure(state)
        self.proxy.limits = config.limits
        await self._sync_pools(config)
        log.info("configuration reloaded: %d pools", len(config.pools))

    async def _sync_pools(self, config: RouterConfig) -> None:
        wanted = {p.key: p for p in config.pools}
        for key in list(self.discoveries):
            if key not in wanted or self.discoveries[key].pool != wanted[key]:
                await self.discoveries.pop(key).stop()
                if key not in wanted:
                    await self.endpoints.drop_pool(key)
                    self.core.pool_removed(key)
                    index = self.indexes.pop(key, None)
                    if index is not None:
                        await index.close()
                    self.directory_metrics.forget_pool(key)
        for key, pool in wanted.items():
            self.metrics.init_pool(key)
            if key not in self.indexes:
                self.indexes[key] = create_pool_index(config.directory, key, self.directory_metrics)
            if key not in self.discoveries:
                discovery = build_discovery(pool, self.endpoints)
                self.discoveries[key] = discovery
                await discovery.start()
            if self.indexer is not None:  # its engine settings, as a reload may change them
                await self.indexer.sync_pool(key)

    async def _endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        self.core.endpoints_changed(added, removed)
        # A pod whose spec changed is removed and added at once; an address may serve in two
        # pools: its connections go only once no endpoint of the fleet uses it.
        serving = {ep.spec.url for ep in self.endpoints.all()}
        for ep in removed:
            if ep.spec.url not in serving:
                self.upstream.forget(ep.spec.url)
        for ep in added:
            self.upstream.know(ep.spec.url)
        for ep in removed:
            index = self.indexes.get(ep.pool)
            if index is not None:
                try:
                    await index.forget_pod(ep.id)
                except Exception as exc:  # the directory being down must not stop discovery
                    self.directory_metrics.fallback_errors.labels("forget_pod").inc()
                    log.warning("could not forget pod %s: %r", ep.id, exc)
            log.info("endpoint %s left pool %s", ep.id, ep.pool)
        if self.indexer is not None:
            await self.indexer.endpoints_changed(added, removed)
        for ep in added:
            index = self.indexes.get(ep.pool)
            # Pods with KV events get their generation from their subscriber (embedded here or
            # in `kvgate indexer`); setting it here too would wipe what the subscriber wrote.
            if index is not None and ep.spec.generation and ep.spec.kv_events is None:
                try:
                    await index.set_generation(ep.id, ep.spec.generation)
                except Exception as exc:
                    self.directory_metrics.fallback_errors.labels("set_generation").inc()
                    log.warning("could not set generation of %s: %r", ep.id, exc)
            log.info("endpoint %s joined pool %s (%s)", ep.id, ep.pool, ep.spec.url)
        self.warmer.dispatch()
        if added:
            self.warm_sharer.wake()  # claim their warm-ups now
        self._update_endpoint_gauges()

    def _update_endpoint_gauges(self) -> None:
        """Each pool's endpoints by state, counted when /metrics is read: an ejection starts
        and ends with no change to the endpoint set (set once then, they read ready for good)."""
        gauge = self.metrics.endpoints
        for pool in self.endpoints.pools():
            gauge.labels(pool, "ready").set_function(partial(self._endpoints_in, pool, True))
            gauge.labels(pool, "ejected").set_function(partial(self._endpoints_in, pool, False))

    def _endpoints_in(self, pool: str, healthy: bool) -> int:
        now = time.monotonic()
        return sum(1 for ep in self.endpoints.in_pool(pool) if ep.healthy(now) == healthy)

    async def _watch_config(
        self, last: tuple[float, int, int] | None, interval: float = 1.0
    ) -> None:
        assert self.config_path is not None
        path = Path(self.config_path)
        while True:
            await asyncio.sleep(interval)
            current = _stat_key(path)
            if current == last:
                continue
            last = current
            try:
                config = await asyncio.to_thread(load_router_config, path)
                await self.reload(config)
            except Exception as exc:
                self.metrics.config_reloads.labels("error").inc()
                log.error("configuration reload failed; keeping the previous one: %s", exc)
            else:
                self.metrics.config_reloads.labels("ok").inc()


def _stat_key(path: Path) -> tuple[float, int, int] | None:
    # Kubernetes updates a mounted ConfigMap by swapping a symlink: compare the resolved file.
    try:
        st = path.resolve().stat()
    except OSError:
        return None
    return (st.st_mtime, st.st_size, st.st_ino)


__all__ = ["PoolConfig", "RouterRuntime", "build_state"]
