"""Build a pool's `BlockIndex` from configuration (`kvgate.api.router_config.DirectoryConfig`).

`memory` gives an in-process index; `redis` one stored under `<key_prefix>:{<pool key>}:` on
the configured server. With a `DirectoryMetrics`, the index is wrapped in
`InstrumentedBlockIndex`. Caps default to the values documented in docs/directory.md.
`create_pool_index` is what routers and `kvgate indexer` use: a Redis index is wrapped in a
`FallbackIndex` over a local memory view, so that losing Redis never fails a request.
"""

from __future__ import annotations

from kvgate.api.router_config import DirectoryConfig, RedisConfig
from kvgate.directory.base import (
    DEFAULT_MAX_APPROXIMATE_PER_POD,
    DEFAULT_MAX_BLOCKS_PER_POD,
    BlockIndex,
)
from kvgate.directory.fallback import FallbackIndex
from kvgate.directory.instrumented import InstrumentedBlockIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex, RedisConnection


def redis_connection(config: RedisConfig) -> RedisConnection:
    """The connection `config` describes, its secrets and CA bundle read now; raises ValueError
    (naming the setting, never a secret's value) if one cannot be read or the URL is wrong."""
    url = config.url_secret.read().strip() if config.url_secret else config.url
    ca_pem = None
    if config.ca_bundle is not None:
        try:
            ca_pem = config.ca_bundle.read()
        except ValueError as exc:
            raise ValueError(f"redis.ca_bundle: {exc}") from exc
    try:
        return RedisConnection(
            url,
            password=config.password.read() if config.password else None,
            cluster=config.cluster,
            ca_pem=ca_pem,
        )
    except ValueError as exc:
        where = "redis.url_secret" if config.url_secret else "redis.url"
        raise ValueError(f"{where}: {exc}") from None


def create_index(
    config: DirectoryConfig,
    pool_key: str,
    *,
    metrics: DirectoryMetrics | None = None,
    max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
    max_approximate_per_pod: int = DEFAULT_MAX_APPROXIMATE_PER_POD,
) -> BlockIndex:
    """The index of pool `pool_key` (`<namespace>/<name>`) as `config` says."""
    index: BlockIndex
    if config.backend == "memory":
        index = MemoryBlockIndex(
            max_blocks_per_pod=max_blocks_per_pod, max_approximate_per_pod=max_approximate_per_pod
        )
    elif config.backend == "redis":
        index = RedisBlockIndex.connect(
            redis_connection(config.redis),
            pool_key,
            socket_timeout_seconds=config.redis.socket_timeout_seconds,
            key_prefix=config.redis.key_prefix,
            max_blocks_per_pod=max_blocks_per_pod,
            max_approximate_per_pod=max_approximate_per_pod,
        )
    else:  # pragma: no cover - the config's Literal type rules this out
        raise ValueError(f"unknown directory backend {config.backend!r}")
    if metrics is not None:
        index = InstrumentedBlockIndex(index, metrics, pool_key)
    return index


def create_pool_index(
    config: DirectoryConfig,
    pool_key: str,
    metrics: DirectoryMetrics,
) -> BlockIndex:
    """A pool's index for a long-running service (a router, `kvgate indexer`); the fallback's
    failures and degraded state are counted in `metrics` (`kvgate_directory_fallback_*`)."""
    if config.backend == "memory":
        return create_index(config, pool_key, metrics=metrics)
    shared = create_index(config, pool_key, metrics=metrics)
    return FallbackIndex(
        shared,
        MemoryBlockIndex(),
        metrics.fallback_errors,
        metrics.fallback_degraded,
        resync_interval=config.redis.resync_interval_seconds,
    )
