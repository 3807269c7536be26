"""Warm-up claims and hot-prefix counts through a real redis-server: the Lua claims behave as
their in-process twin (which the discrete-event bench uses), and what a bad writer leaves is
not read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from kvgate.directory.keys import PoolKeys
from kvgate.directory.shared_warmup import (
    MAX_CLAIM_BYTES,
    MAX_HOT_FIELD_BYTES,
    HotPrefixBoard,
    MemoryWarmClaims,
    RedisWarmClaims,
)

Claims = RedisWarmClaims | MemoryWarmClaims


@pytest.fixture(params=["redis", "memory"])
async def claims(
    request: pytest.FixtureRequest, redis_url: str
) -> AsyncIterator[tuple[Claims, Callable[[float], Awaitable[None]]]]:
    """(claims, advance(seconds)): real time on Redis, a fake clock in process."""
    if request.param == "memory":
        now = [0.0]

        async def advance(seconds: float) -> None:
            now[0] += seconds

        yield MemoryWarmClaims(lambda: now[0]), advance
        return
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield RedisWarmClaims(client, "ns/pool", key_prefix="test"), asyncio.sleep
    finally:
        await client.aclose()


async def test_one_claim_per_pod_generation_and_its_life(claims: Any) -> None:
    board, advance = claims
    claim = board.claim
    assert await claim("p", "g1", "a", can_warm=False, ttl_seconds=5) == ("nothing", "")
    assert await claim("p", "g1", "a", can_warm=True, ttl_seconds=0.4) == ("claimed", "a")
    assert await claim("p", "g1", "b", can_warm=True, ttl_seconds=5) == ("follow", "a")
    assert await claim("p", "g1", "c", can_warm=False, ttl_seconds=5) == ("follow", "a")
    assert await board.states([("p", "g1"), ("p", "g0"), ("q", "g1")]) == [
        "warming", "gone", "gone"
    ]  # fmt: skip
    assert not await board.done("p", "g1", "b", grace_seconds=5)  # not b's to mark
    assert await board.done("p", "g1", "a", grace_seconds=0.4)
    assert await board.states([("p", "g1")]) == ["done"]
    assert await claim("p", "g1", "d", can_warm=True, ttl_seconds=5) == ("done", "a")
    await advance(0.5)  # the grace is over: a join heard now is another warm-up
    assert await board.states([("p", "g1")]) == ["gone"]
    assert await claim("p", "g1", "d", can_warm=True, ttl_seconds=5) == ("claimed", "d")
    # a replaced pod (new generation) is claimed anew; the claimant's own rejoin too
    assert await claim("p", "g2", "b", can_warm=True, ttl_seconds=0.4) == ("claimed", "b")
    assert await claim("p", "g2", "b", can_warm=True, ttl_seconds=0.4) == ("claimed", "b")
    await advance(0.5)  # a claimant that stopped: its claim expires
    assert await board.states([("p", "g2")]) == ["gone"]
    assert await board.states([]) == []


async def test_a_generation_with_the_separator_in_it_is_still_one_claim(claims: Any) -> None:
    board, _ = claims
    assert await board.claim("p", "a|b", "r1", can_warm=True, ttl_seconds=5) == ("claimed", "r1")
    assert await board.claim("p", "a|b", "r2", can_warm=True, ttl_seconds=5) == ("follow", "r1")
    assert await board.states([("p", "a|b")]) == ["warming"]


async def test_a_claim_a_bad_writer_left_is_taken_over(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = RedisWarmClaims(client, "ns/pool", key_prefix="test")
        key = PoolKeys.for_pool("ns/pool", "test").warm_claim("p")
        for junk in (b"g1|x|a", b"no separators", b"g1|w|" + b"x" * 2000):
            await client.set(key, junk)
            assert await board.states([("p", "g1")]) == ["gone"]
            assert await board.claim("p", "g1", "b", can_warm=True, ttl_seconds=5) == (
                "claimed",
                "b",
            )
        assert 0 < await client.pttl(key) <= 5000
        # a replica with nothing to warm takes nothing: the junk stays as it is
        await client.set(key, b"no separators")
        assert await board.claim("p", "g1", "c", can_warm=False, ttl_seconds=5) == ("nothing", "")
        assert await client.get(key) == b"no separators"
        # MAX_CLAIM_BYTES is the scripts' bound: a claim of that size is read, one byte more not
        owner = b"x" * (MAX_CLAIM_BYTES - len(b"g1|w|"))
        await client.set(key, b"g1|w|" + owner)
        assert await board.states([("p", "g1")]) == ["warming"]
        assert await board.claim("p", "g1", "b", can_warm=True, ttl_seconds=5) == (
            "follow",
            owner.decode(),
        )
        await client.set(key, b"g1|w|x" + owner)
        assert await board.states([("p", "g1")]) == ["gone"]
    finally:
        await client.aclose()


async def test_hot_counts_are_exchanged_and_a_bad_field_is_not_read(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = HotPrefixBoard(client, "ns/pool", key_prefix="test")
        await board.exchange("b", {b"\x01" * 32: 4.0}, ttl_seconds=5.0, max_replicas=8)
        seconds, micros = await client.time()
        stamp = str(seconds * 1000 + micros // 1000).encode()
        await client.hset(board.key, "huge", stamp + b"|{" + b" " * MAX_HOT_FIELD_BYTES + b"}")
        await client.hset(board.key, "junk", stamp + b'|{"zz": 1, "0101": "x", "0202": 2}')
        await client.hset(board.key, "stale", b"1|{}")
        seen = await board.exchange("a", {b"\x02" * 32: 1.0}, ttl_seconds=5.0, max_replicas=8)
        assert seen == {"b": {b"\x01" * 32: 4.0}, "junk": {b"\x02\x02": 2.0}}
        assert not await client.hexists(board.key, "stale")  # deleted: too old
        assert 0 < await client.pttl(board.key) <= 50_000  # ten TTLs after the last write
    finally:
        await client.aclose()
