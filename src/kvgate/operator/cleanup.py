"""Clearing a deleted pool's entries from the shared Redis directory (the pool's finalizer).

The directory keeps one index per pool (`<namespace>/<pool>`); clearing it means forgetting
every pod it knows, through the same `BlockIndex` interface the router and indexer use, so the
operator never needs to know a Redis key format. The whole operation runs under one timeout and
the index's sockets have their own short timeouts: with Redis down or unreachable, `clear_pool`
raises within `timeout_seconds` instead of holding the finalizer (and `kubectl delete`) hostage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.directory.base import BlockIndex
from kvgate.directory.redis_url import redacted_url


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where a policy keeps its directory (secrets already read)."""

    url: str
    key_prefix: str
    password: str | None = None
    cluster: bool = False
    ca_pem: str | None = None

    @property
    def display_url(self) -> str:
        """The URL without its password, for events and logs."""
        return redacted_url(self.url)


IndexFactory = Callable[[RedisTarget, str, float], BlockIndex]


def redis_index(target: RedisTarget, pool_key: str, timeout_seconds: float) -> BlockIndex:
    from kvgate.directory.redis import RedisBlockIndex, RedisConnection

    connection = RedisConnection(
        target.url, password=target.password, cluster=target.cluster, ca_pem=target.ca_pem
    )
    return RedisBlockIndex.connect(
        connection,
        pool_key,
        socket_timeout_seconds=timeout_seconds,
        key_prefix=target.key_prefix,
    )


async def forget_all_pods(index: BlockIndex) -> int:
    """Forget every pod of the index; returns how many there were."""
    pods = sorted(await index.pods())
    for pod in pods:
        await index.forget_pod(pod)
    return len(pods)


async def clear_pool(
    target: RedisTarget,
    pool_key: str,
    *,
    timeout_seconds: float,
    factory: IndexFactory = redis_index,
) -> int:
    """Forget every pod of `pool_key` in the directory at `target`; raises on failure/timeout."""
    index = factory(target, pool_key, timeout_seconds)
    try:
        return await asyncio.wait_for(forget_all_pods(index), timeout_seconds)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(index.close(), 1.0)
