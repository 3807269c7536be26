"""A master of a real Redis Cluster dies under directory traffic (SIGKILL, three masters with one
replica each): requests keep being answered (from the router's local view while the pool's slot
has no master), the replica is promoted, and afterwards Redis holds every write, including all
that were made while the slot was down, for this router and for a second one reading Redis only.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from redis.asyncio.cluster import RedisCluster
from tests.integration.conftest import RedisServer
from tests.integration.redis_cluster import RedisClusterNodes
from tests.unit.directory.conformance import chain

from kvgate.directory.fallback import FallbackIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex, RedisConnection

POOL = "ns/pool"


def _offset(node: RedisServer, field: str) -> int:
    found = re.search(rf"{field}:(\d+)".encode(), node.command("INFO", "replication"))
    assert found is not None
    return int(found.group(1))


def _wait_replicated(master: RedisServer, nodes: list[RedisServer]) -> None:
    """Until the master's replica has applied all it has (replication is asynchronous)."""
    mark = f"master_port:{master.port}\r".encode()
    replicas = [n for n in nodes if mark in n.command("INFO", "replication")]
    assert replicas
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        target = _offset(master, "master_repl_offset")
        if all(_offset(r, "slave_repl_offset") >= target for r in replicas):
            return
        time.sleep(0.05)
    raise AssertionError("replicas did not catch up")


async def test_a_killed_master_is_replaced_and_nothing_is_lost(
    redis_cluster_factory: Callable[[int], RedisClusterNodes],
) -> None:
    cluster = redis_cluster_factory(1)
    connection = RedisConnection(cluster.url, cluster=True)
    metrics = DirectoryMetrics(CollectorRegistry())
    router = FallbackIndex(
        RedisBlockIndex.connect(connection, POOL, socket_timeout_seconds=0.5),
        MemoryBlockIndex(),
        metrics.fallback_errors,
        metrics.fallback_degraded,
        resync_interval=0.2,
    )
    other_router = RedisBlockIndex.connect(connection, POOL, socket_timeout_seconds=0.5)
    raw = await RedisCluster.from_url(cluster.url).initialize()
    keys = chain(160)
    try:
        await router.set_generation("a", "ga")
        await router.add("a", keys[:64], generation="ga")
        await router.add("c", keys[:16], medium="CPU")
        assert await other_router.lookup(keys) == {"a": 64, "c": 16}

        owner = raw.get_node_from_key(f"kvgate:{{{POOL}}}:pods")
        master = cluster.node_at(owner.port)
        _wait_replicated(master, cluster.nodes)
        master.kill()

        # The slot has no master until a replica is promoted: every call must still answer.
        slowest = 0.0
        for step in range(6):
            started = time.monotonic()
            await router.add("a", keys[64 + 16 * step : 80 + 16 * step], generation="ga")
            await router.add("b", keys[: 8 * (step + 1)])
            assert (await router.lookup(keys))["a"] == 80 + 16 * step
            slowest = max(slowest, time.monotonic() - started)
            await asyncio.sleep(0.1)
        await router.remove("c", keys[8:16], medium="CPU")
        assert slowest < 3.0
        outage_errors = sum(s.value for m in metrics.fallback_errors.collect() for s in m.samples)
        assert outage_errors > 0  # the calls did fail over to the local view

        cluster.wait_healthy()
        assert master not in cluster.masters()  # its replica took over
        deadline = time.monotonic() + 30
        expected = {"a": 160, "b": 48, "c": 8}
        while time.monotonic() < deadline:
            await router.lookup(keys)  # starts the resync once Redis answers
            if router.resync_task is not None:
                await router.resync_task
            if not router.unsynced and not router.degraded:
                try:
                    if await other_router.lookup(keys) == expected:
                        break
                except Exception:  # the second router's client may still be on the old map
                    pass
            await asyncio.sleep(0.2)
        assert await other_router.lookup(keys) == expected
        assert await other_router.get_generation("a") == "ga"
        assert await router.lookup(keys) == expected
        assert not router.degraded
    finally:
        await router.close()
        await other_router.close()
        await raw.aclose()
