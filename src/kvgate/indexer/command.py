"""`kvgate indexer --config FILE`: KV-event subscriptions writing to the shared directory.

Runs the router's discovery and indexer without the data plane: every ready pod of every pool
in the config that publishes KV events is subscribed, and its events are applied to the pool's
Redis index, which any number of routers (with `directory.embedded_indexer: false`) read.
Serves `/metrics` (kvgate_directory_*) and `/health` on `--port` (default 8001); the size
gauges (`kvgate_directory_pods`, `kvgate_directory_entries`) are refreshed every few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvgate.api.router_config import RouterConfig, load_router_config
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STATS_INTERVAL_SECONDS = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="router config file (YAML)")
    parser.add_argument("--host", default="0.0.0.0", help="metrics listen address")
    parser.add_argument("--port", type=int, default=8001, help="metrics/health port")
    parser.add_argument(
        "--allow-memory",
        action="store_true",
        help="allow a memory directory (useful only for tests: nobody else can read it)",
    )


class IndexerService:
    """Discovery + subscriptions + indexes; `start()`/`stop()` own every task and connection."""

    def __init__(self, config: RouterConfig) -> None:
        from kvgate.directory.factory import create_pool_index
        from kvgate.directory.metrics import DirectoryMetrics
        from kvgate.discovery.endpoints import EndpointSet
        from kvgate.indexer.subscriptions import EventIndexer

        self.config = config
        self.registry = CollectorRegistry()
        self.directory_metrics = DirectoryMetrics(self.registry)
        self.endpoints = EndpointSet()
        self.indexes = {
            p.key: create_pool_index(config.directory, p.key, self.directory_metrics)
            for p in config.pools
        }
        engines = {p.key: p.engine for p in config.pools}
        self.indexer = EventIndexer(
            self.endpoints,
            self.indexes,
            self.directory_metrics,
            config.directory.kv_events,
            engine_of=engines.get,
        )
        self.endpoints.add_listener(self.indexer.endpoints_changed)
        self._discoveries: list[Any] = []
        self._stats_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from kvgate.discovery import build_discovery

        for pool in self.config.pools:
            discovery = build_discovery(pool, self.endpoints)
            self._discoveries.append(discovery)
            await discovery.start()
        self._stats_task = asyncio.create_task(self._refresh_stats(), name="indexer-stats")

    async def _refresh_stats(self) -> None:
        """Keep the directory size gauges current (the instrumented index sets them in stats())."""
        from kvgate.indexer.subscriptions import refresh_directory_stats

        await refresh_directory_stats(self.indexes, STATS_INTERVAL_SECONDS)

    async def stop(self) -> None:
        await cancel_and_wait(self._stats_task)
        for discovery in self._discoveries:
            await discovery.stop()
        await self.indexer.close()
        for index in self.indexes.values():
            await index.close()

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            status, body, ctype = 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        elif scope["path"] in ("/health", "/ready"):
            status, body, ctype = 200, b'{"status":"ok"}', "application/json"
        else:
            status, body, ctype = 404, b'{"error":{"message":"not found"}}', "application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def run(args: argparse.Namespace) -> int:
    from kvgate.serving import EdgeLimits, EdgeState, connection_budget, listen, serve

    try:
        config = load_router_config(args.config)
    except (ValueError, OSError) as exc:
        print(f"kvgate indexer: {exc}")
        return 2
    if config.directory.backend != "redis" and not args.allow_memory:
        print("kvgate indexer: directory.backend must be redis (routers read what it writes)")
        return 2
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        print(f"kvgate indexer: cannot listen on {args.host}:{args.port}: {exc}")
        return 2
    service = IndexerService(config)
    print(f"kvgate indexer: {len(config.pools)} pool(s); metrics on :{args.port}", flush=True)
    # Only /metrics and /health: the router's connection limits, with a small cap.
    edge = EdgeState(EdgeLimits(max_connections=connection_budget(256, 64)))
    serve(
        service,
        sock,
        edge=edge,
        lifespan="on",
        log_level="warning",
        access_log=False,
    )
    return 0


__all__ = ["IndexerService", "add_arguments", "run"]
