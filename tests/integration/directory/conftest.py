"""Redis Cluster fixtures (real `redis-server --cluster-enabled` processes, stopped afterwards)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.integration.redis_cluster import RedisClusterNodes


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """Three masters without replicas, shared by the session (prefer `redis_cluster_url`)."""
    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterNodes) -> str:
    """URL of one node of an emptied three-master Redis Cluster."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def redis_cluster_factory(tmp_path: Path) -> Iterator[Callable[[int], RedisClusterNodes]]:
    """Start dedicated clusters (`replicas` per master) a test may break; stopped at teardown."""
    clusters: list[RedisClusterNodes] = []

    def start(replicas: int) -> RedisClusterNodes:
        cluster = RedisClusterNodes(tmp_path / f"cluster-{len(clusters)}", replicas=replicas)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()
