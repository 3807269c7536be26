"""The Redis backend against the conformance suite on a real redis-server, plus Redis-only checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
    check_only_the_owners_writes_show_it_alive,
)

from kvgate.directory.base import HISTORY_CHUNK_KEYS, MAX_COPIES, BlockIndex
from kvgate.directory.redis import EPOCH_TTL_SECONDS, MAX_STATS_PODS, RedisBlockIndex


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def index(redis_url: str, clock: FakeClock) -> AsyncIterator[RedisBlockIndex]:
    idx = RedisBlockIndex.from_url(
        redis_url,
        "ns/pool",
        key_prefix="test",
        max_blocks_per_pod=CAP,
        max_approximate_per_pod=APPROX_CAP,
        clock=clock,
    )
    yield idx
    await idx.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


class TestRedisConformance(BlockIndexConformance):
    pass


def test_satisfies_protocol(index: RedisBlockIndex) -> None:
    assert isinstance(index, BlockIndex)


async def test_every_key_is_under_the_prefix_and_hash_tag(
    index: RedisBlockIndex, raw: aioredis.Redis
) -> None:
    await index.add("a", chain(3), generation="g")
    await index.add_approximate("b", chain(2), ttl_seconds=60)
    names = sorted(k.decode() for k in await raw.keys("*"))
    assert names == [
        "test:{ns/pool}:a:b",
        "test:{ns/pool}:m:0",
        "test:{ns/pool}:meta",
        "test:{ns/pool}:pods",
        "test:{ns/pool}:seen",
        "test:{ns/pool}:x:a",
    ]


async def test_cleared_entries_are_reclaimed_and_slots_reused(
    index: RedisBlockIndex, raw: aioredis.Redis
) -> None:
    keys = chain(CAP)
    for generation in range(20):
        await index.set_generation("a", f"g{generation}")
        await index.add("a", keys, generation=f"g{generation}")
        await index.add("b", keys[:3])
    assert await index.lookup(keys) == {"a": CAP, "b": 3}
    await index.forget_pod("a")
    await index.clear_pod("b")
    assert await index.lookup(keys) == {}
    names = {k.decode() for k in await raw.keys("*")}
    assert not any(":gc:" in n or n.endswith(":m:0") for n in names), names
    assert await raw.llen("test:{ns/pool}:gcq") == 0
    assert int(await raw.hget("test:{ns/pool}:meta", "next_slot")) <= 3
    await index.forget_pod("b")
    assert await raw.keys("*") == []  # a pool without pods leaves nothing behind


async def test_pools_are_isolated(redis_url: str) -> None:
    one = RedisBlockIndex.from_url(redis_url, "ns/one")
    two = RedisBlockIndex.from_url(redis_url, "ns/two")
    try:
        await one.add("a", chain(3))
        assert await two.lookup(chain(3)) == {}
        await two.forget_pod("a")
        assert await one.lookup(chain(3)) == {"a": 3}
    finally:
        await one.close()
        await two.close()


async def test_two_clients_share_one_directory(index: RedisBlockIndex, redis_url: str) -> None:
    other = RedisBlockIndex.from_url(redis_url, "ns/pool", key_prefix="test")
    try:
        await index.add("a", chain(4), generation="g1")
        assert await other.lookup(chain(4)) == {"a": 4}
        await other.set_generation("a", "g2")
        assert await index.lookup(chain(4)) == {}
    finally:
        await other.close()


async def test_lookup_is_one_round_trip(index: RedisBlockIndex, raw: aioredis.Redis) -> None:
    keys = chain(2048, "long")
    for pod in range(4):
        await index.add(f"p{pod}", keys[:CAP])
    await raw.config_resetstat()
    assert await index.lookup(keys) == {f"p{pod}": CAP for pod in range(4)}
    info = await raw.info("commandstats")
    client_calls = {
        k: v["calls"] for k, v in info.items() if k in {"cmdstat_evalsha", "cmdstat_eval"}
    }
    assert sum(client_calls.values()) == 1


async def test_copies_are_counted_in_the_media_value(
    index: RedisBlockIndex, raw: aioredis.Redis
) -> None:
    key, other = chain(2)
    await index.add("a", [key, other])
    await index.add("a", [key, key], medium="CPU")
    await index.add("a", [key])
    x = "test:{ns/pool}:x:a"
    assert await raw.hget(x, other) == b"GPU"  # one copy: the value it has always been
    assert await raw.hget(x, key) == b"GPU*2,CPU*2"
    assert await index.lookup([key], medium="GP") == {}  # a medium's name, not a prefix of it
    await index.add("a", [key] * 1000)
    assert await raw.hget(x, key) == f"GPU*{MAX_COPIES},CPU*2".encode()


async def test_values_written_before_copies_were_counted_read_as_one_copy(
    index: RedisBlockIndex, raw: aioredis.Redis
) -> None:
    keys = chain(1)
    await index.add("a", keys)
    await raw.hset("test:{ns/pool}:x:a", keys[0], "CPU,GPU")  # as an older kvgate wrote it
    await index.remove("a", keys)
    assert await index.lookup(keys, medium="GPU") == {}
    assert await index.lookup(keys, medium="CPU") == {"a": 1}
    await index.add("a", keys, medium="CPU")
    assert await raw.hget("test:{ns/pool}:x:a", keys[0]) == b"CPU*2"


async def test_approximate_entries_expire_in_redis_too(
    index: RedisBlockIndex, raw: aioredis.Redis
) -> None:
    await index.add_approximate("a", chain(2), ttl_seconds=30)
    ttl_ms = await raw.pttl("test:{ns/pool}:a:a")
    assert 0 < ttl_ms <= 30_000


async def test_a_long_routing_history_is_written_a_chunk_per_script(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """No one script holds Redis for a whole long prompt's history (other routers wait)."""
    index = RedisBlockIndex.from_url(redis_url, "ns/long", key_prefix="test")
    keys = chain(3 * HISTORY_CHUNK_KEYS + 5, "long")
    try:
        await index.add_approximate("a", keys[:1], ttl_seconds=60)  # loads the script
        await raw.config_resetstat()
        await index.add_approximate("a", keys, ttl_seconds=60)
        info = await raw.info("commandstats")
        assert info["cmdstat_evalsha"]["calls"] == 4
        assert await index.lookup(keys) == {"a": len(keys)}
    finally:
        await index.close()


async def test_a_chain_longer_than_lua_unpacks_is_looked_up(redis_url: str) -> None:
    """Lua unpacks at most ~8,000 values in one call: a chain of more blocks (128k tokens of
    16) made every lookup fail where a pod had approximate entries (routing history, or blocks
    in flight shared by replicas), and three failures in a row turned the router degraded."""
    index = RedisBlockIndex.from_url(redis_url, "ns/unpack", key_prefix="test")
    keys = chain(10_000, "unpack")
    try:
        for pod in ("a", "b"):
            await index.add_approximate(pod, keys, ttl_seconds=60)
        await index.add("c", keys)
        await index.add_approximate("c", chain(1, "other"), ttl_seconds=60)
        expected = {"a": len(keys), "b": len(keys), "c": len(keys)}
        assert await index.lookup(keys) == expected
        assert await index.lookup(keys, medium="GPU") == expected
    finally:
        await index.close()


async def test_a_long_chain_in_one_medium_is_looked_up_a_chunk_per_script(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The medium is read key by key for each pod: one script over a long chain held Redis,
    every router's call, 0.5 s (65,536 blocks, 16 pods). Only pods that held every key of a
    chunk are asked about the next one."""
    index = RedisBlockIndex.from_url(redis_url, "ns/medium", key_prefix="test")
    keys = chain(2 * HISTORY_CHUNK_KEYS + 5, "medium")
    try:
        await index.add("a", keys)
        await index.add("b", keys[: HISTORY_CHUNK_KEYS + 3])
        await index.add("c", keys[:7], medium="CPU")
        await index.lookup(keys[:1], medium="GPU")  # loads the script
        await raw.config_resetstat()
        got = await index.lookup(keys, medium="GPU")
        assert got == {"a": len(keys), "b": HISTORY_CHUNK_KEYS + 3}
        info = await raw.info("commandstats")
        assert info["cmdstat_evalsha"]["calls"] == 3
        assert await index.lookup(keys, ["b", "c"], medium="CPU") == {"c": 7}
    finally:
        await index.close()


async def test_stats_cost_one_script_whatever_the_registry_holds(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Every registry field was read and parsed on the event loop (3.9 s every 5 s for 100,000
    fields anyone who can write Redis could add): stats now sum a bounded sample's entries."""
    index = RedisBlockIndex.from_url(redis_url, "ns/stats", key_prefix="test")
    try:
        await index.add("a", chain(3, "st"))
        registry = "test:{ns/stats}:pods"
        await raw.hset(registry, mapping={f"junk{i}": "9|" for i in range(2 * MAX_STATS_PODS)})
        await raw.config_resetstat()
        stats = await index.stats()
        info = await raw.info("commandstats")
        assert stats.pods == 2 * MAX_STATS_PODS + 1 and stats.entries <= 3
        assert "cmdstat_hkeys" not in info and info["cmdstat_evalsha"]["calls"] == 1
    finally:
        await index.close()


async def test_a_pod_forgotten_between_two_chunks_of_its_history_stays_forgotten(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Discovery forgets a pod that left while a long history for it is written: the later
    chunks re-registered it, and its registry field and slot were never freed."""
    index = RedisBlockIndex.from_url(redis_url, "ns/left", key_prefix="test")
    run = index._run
    chunks = 0

    async def forget_after_the_first_chunk(script: Any, args: list[Any]) -> Any:
        nonlocal chunks
        result = await run(script, args)
        if script is index._add_approximate:
            chunks += 1
            if chunks == 1:
                await index.forget_pod("a")
        return result

    index._run = forget_after_the_first_chunk  # type: ignore[method-assign]
    try:
        await index.add_approximate("a", chain(3 * HISTORY_CHUNK_KEYS, "left"), ttl_seconds=60)
        assert chunks == 2  # the second was refused; no third was sent
        assert await index.pods() == set()
        assert not await raw.exists("test:{ns/left}:a:a")
        await index.add_approximate("a", chain(2, "left"), ttl_seconds=60)  # it came back
        assert await index.pods() == {"a"}
    finally:
        await index.close()


async def test_the_epoch_outlives_a_pool_left_without_pods(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The registry empties when a one-pod pool's pod is replaced: no data was lost, so the
    epoch stays (dropped with the pool's other keys, it read as a Redis that lost everything,
    and every writer rebuilt every pod)."""
    index = RedisBlockIndex.from_url(redis_url, "ns/epoch", key_prefix="test")
    try:
        epoch, _ = await index.audit([])
        await index.add("a", chain(3, "epoch"))
        await index.forget_pod("a")
        await index.collect_garbage()
        assert await index.pods() == set()
        assert await index.audit(["a"]) == (epoch, {"a"})
        assert 0 < await raw.ttl("test:{ns/epoch}:epoch") <= EPOCH_TTL_SECONDS
    finally:
        await index.close()


def test_bad_pool_key_or_prefix() -> None:
    client = aioredis.Redis()
    with pytest.raises(ValueError):
        RedisBlockIndex(client, "ns/{pool}")
    with pytest.raises(ValueError):
        RedisBlockIndex(client, "ns/pool", key_prefix="")


async def test_only_the_owners_writes_show_it_alive(index: RedisBlockIndex) -> None:
    await check_only_the_owners_writes_show_it_alive(index, asyncio.sleep)
