"""The Redis backend on a real three-master Redis Cluster: the conformance suite (plain, under
FallbackIndex, and over TLS), pools spread over the masters, and the Lua scripts staying in one
slot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio.cluster import RedisCluster
from tests.integration.conftest import make_tls_files
from tests.integration.redis_cluster import RedisClusterNodes
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.directory.base import BlockIndex
from kvgate.directory.fallback import FallbackIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex, RedisConnection


def cluster_index(url: str, pool: str = "ns/pool", **kwargs: object) -> RedisBlockIndex:
    return RedisBlockIndex.connect(
        RedisConnection(url, cluster=True),
        pool,
        key_prefix="test",
        max_blocks_per_pod=CAP,
        max_approximate_per_pod=APPROX_CAP,
        socket_timeout_seconds=2.0,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def index(redis_cluster_url: str, clock: FakeClock) -> AsyncIterator[RedisBlockIndex]:
    idx = cluster_index(redis_cluster_url, clock=clock)
    yield idx
    await idx.close()


class TestRedisClusterConformance(BlockIndexConformance):
    pass


class TestFallbackOverRedisClusterConformance(BlockIndexConformance):
    @pytest.fixture
    async def index(  # type: ignore[override]
        self, redis_cluster_url: str, clock: FakeClock
    ) -> AsyncIterator[BlockIndex]:
        metrics = DirectoryMetrics(CollectorRegistry())
        fallback = FallbackIndex(
            cluster_index(redis_cluster_url, clock=clock),
            MemoryBlockIndex(
                clock=clock, max_blocks_per_pod=CAP, max_approximate_per_pod=APPROX_CAP
            ),
            metrics.fallback_errors,
            metrics.fallback_degraded,
        )
        yield fallback
        await fallback.close()


async def test_pools_live_on_different_masters_and_stay_apart(
    redis_cluster: RedisClusterNodes, redis_cluster_url: str
) -> None:
    """Many pools hash to slots all over the cluster; each answers only for itself."""
    pools = [cluster_index(redis_cluster_url, f"ns/pool-{i}") for i in range(12)]
    client = await RedisCluster.from_url(redis_cluster_url).initialize()
    try:
        for i, pool in enumerate(pools):
            await pool.add(f"pod-{i}", chain(4 + i, tag=f"t{i}"), generation="g")
            await pool.add_approximate("shared", chain(2), ttl_seconds=60)
        owners = {client.get_node_from_key(pool.keys.registry).port for pool in pools}
        assert len(owners) == 3  # 12 pools, 3 masters: each master holds some
        for i, pool in enumerate(pools):
            assert await pool.lookup(chain(4 + i, tag=f"t{i}")) == {f"pod-{i}": 4 + i}
            assert await pool.pods() == {f"pod-{i}", "shared"}
        await pools[0].forget_pod("pod-0")
        assert await pools[1].lookup(chain(5, tag="t1")) == {"pod-1": 5}
    finally:
        for pool in pools:
            await pool.close()
        await client.aclose()


async def test_every_key_of_a_pool_is_in_its_slot(redis_cluster_url: str) -> None:
    index = cluster_index(redis_cluster_url, "team-a/llama")
    client = await RedisCluster.from_url(redis_cluster_url).initialize()
    try:
        await index.add("a", chain(3), generation="g1")
        await index.add_approximate("b", chain(2), ttl_seconds=60)
        await index.set_generation("a", "g2")  # leaves a gc: hash and queue behind for a moment
        await index.add("a", chain(3), generation="g2")
        slot = client.keyslot(index.keys.registry)
        node = client.get_node_from_key(index.keys.registry)
        names = await client.execute_command(
            "CLUSTER", "GETKEYSINSLOT", slot, 100, target_nodes=node
        )
        assert len(names) >= 5
        assert {client.keyslot(n) for n in names} == {slot}
        assert all(n.startswith(b"test:{team-a/llama}:") for n in names)
    finally:
        await index.close()
        await client.aclose()


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """Three masters speaking only TLS (clients, cluster bus), certificates from a test CA."""
    tls = make_tls_files(tmp_path_factory.mktemp("cluster-tls"))
    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster-tls"), tls=tls)
    cluster.start()
    yield cluster
    cluster.stop()


class TestRedisClusterOverTlsConformance(BlockIndexConformance):
    """A managed Redis Cluster with TLS (rediss://, the CA bundle given): the same semantics."""

    @pytest.fixture
    async def index(  # type: ignore[override]
        self, tls_cluster: RedisClusterNodes, clock: FakeClock
    ) -> AsyncIterator[BlockIndex]:
        tls_cluster.flushall()
        assert tls_cluster.tls is not None and tls_cluster.url.startswith("rediss://")
        idx = RedisBlockIndex.connect(
            RedisConnection(tls_cluster.url, cluster=True, ca_pem=tls_cluster.tls.ca.read_text()),
            "ns/pool",
            key_prefix="test",
            max_blocks_per_pod=CAP,
            max_approximate_per_pod=APPROX_CAP,
            socket_timeout_seconds=2.0,
            clock=clock,
        )
        yield idx
        await idx.close()
