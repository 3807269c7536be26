"""The metrics decorator changes no behaviour (conformance) and reports what happened."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.api.router_config import DirectoryConfig
from kvgate.directory.base import BlockIndex
from kvgate.directory.factory import create_index
from kvgate.directory.instrumented import InstrumentedBlockIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def index(clock: FakeClock, registry: CollectorRegistry) -> InstrumentedBlockIndex:
    inner = MemoryBlockIndex(
        max_blocks_per_pod=CAP, max_approximate_per_pod=APPROX_CAP, clock=clock
    )
    return InstrumentedBlockIndex(inner, DirectoryMetrics(registry), "ns/pool")


class TestInstrumentedConformance(BlockIndexConformance):
    pass


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"pool": "ns/pool", **labels}) or 0.0


async def test_metrics_report_operations(
    index: InstrumentedBlockIndex, registry: CollectorRegistry
) -> None:
    keys = chain(8)
    await index.set_generation("a", "g2")
    await index.add("a", keys, generation="g2")
    await index.add("a", keys, generation="g1")  # stale
    assert await index.lookup(keys) == {"a": 8}
    with pytest.raises(ValueError):
        await index.add("a", keys, medium="")
    await index.stats()
    ops = "kvgate_directory_operations_total"
    assert sample(registry, ops, operation="add", outcome="ok") == 1
    assert sample(registry, ops, operation="add", outcome="stale") == 1
    assert sample(registry, ops, operation="add", outcome="error") == 1
    assert sample(registry, "kvgate_directory_blocks_written_total", operation="add") == 8
    assert sample(registry, "kvgate_directory_lookup_matched_blocks_sum") == 8
    assert (
        sample(registry, "kvgate_directory_operation_duration_seconds_count", operation="lookup")
        == 1
    )
    assert sample(registry, "kvgate_directory_entries", kind="exact") == 8
    assert sample(registry, "kvgate_directory_pods") == 1


async def test_factory_builds_each_backend(registry: CollectorRegistry) -> None:
    memory = create_index(DirectoryConfig(), "ns/pool")
    assert isinstance(memory, MemoryBlockIndex)
    wrapped = create_index(DirectoryConfig(), "ns/pool", metrics=DirectoryMetrics(registry))
    assert isinstance(wrapped, InstrumentedBlockIndex)
    assert isinstance(wrapped.inner, MemoryBlockIndex)
    config = DirectoryConfig.model_validate({"backend": "redis", "redis": {"key_prefix": "kv"}})
    remote = create_index(config, "ns/pool")  # connects lazily: nothing is contacted here
    assert isinstance(remote, RedisBlockIndex)
    assert remote.keys.registry == "kv:{ns/pool}:pods"
    await remote.close()
    for index in (memory, wrapped, remote):
        assert isinstance(index, BlockIndex)
