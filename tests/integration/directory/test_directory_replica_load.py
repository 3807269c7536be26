"""Replica loads exchanged through a real redis-server: what a bad writer leaves is not read."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from kvgate.directory.replica_board import MAX_REPLICA_ID_BYTES
from kvgate.directory.replica_load import MAX_FIELD_BYTES, MAX_ROUND_BYTES, ReplicaLoadBoard


async def stamp(client: aioredis.Redis) -> bytes:
    """Now on Redis' clock, as a field's value starts: what a replica writes there."""
    seconds, micros = await client.time()
    return str(seconds * 1000 + micros // 1000).encode()


async def test_an_oversized_field_is_not_sent_back(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = ReplicaLoadBoard(client, "ns/pool", key_prefix="test")
        await board.exchange("b", {"p": (1, 2, 3)}, ttl_seconds=5.0, max_replicas=2)
        await client.hset(
            board.key, "bad", await stamp(client) + b"|{" + b" " * MAX_FIELD_BYTES + b"}"
        )
        assert await client.hstrlen(board.key, "bad") > MAX_FIELD_BYTES
        replies: list[Any] = []
        script = board._script

        async def recording(**kwargs: Any) -> Any:
            replies.append(await script(**kwargs))
            return replies[-1]

        board._script = recording  # type: ignore[assignment]
        seen = await board.exchange("a", {"p": (0, 0, 0)}, ttl_seconds=5.0, max_replicas=2)
        assert seen == {"b": {"p": (1, 2, 3, 0)}}  # three counts: a replica of before batch
        assert replies[0][::2] == [b"b"]  # the oversized field never crossed the wire
    finally:
        await client.aclose()


async def test_a_field_of_a_name_no_replica_has_is_deleted_unread(redis_url: str) -> None:
    """Values were bounded, names not: 64 fields of 1 MiB names cost every reader 64 MiB a
    round (and the load exchange its 50 ms budget)."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = ReplicaLoadBoard(client, "ns/names", key_prefix="test")
        await board.exchange("b", {"p": (1, 2, 3)}, ttl_seconds=5.0, max_replicas=2)
        long_name = "x" * (MAX_REPLICA_ID_BYTES + 1)
        await client.hset(board.key, long_name, await stamp(client) + b'|{"p": [0, 0, 0]}')
        seen = await board.exchange("a", {"p": (0, 0, 0)}, ttl_seconds=5.0, max_replicas=4)
        assert set(seen) == {"b"}
        assert not await client.hexists(board.key, long_name)
    finally:
        await client.aclose()


async def test_counts_round_trip_with_their_batch_requests(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = ReplicaLoadBoard(client, "ns/pool", key_prefix="test")
        await board.exchange("b", {"p": (4, 1, 900, 2)}, ttl_seconds=5.0, max_replicas=2)
        seen = await board.exchange("a", {"p": (0, 0, 0, 0)}, ttl_seconds=5.0, max_replicas=2)
        assert seen == {"b": {"p": (4, 1, 900, 2)}}
    finally:
        await client.aclose()


async def test_what_is_parsed_is_bounded_by_the_pods_this_replica_knows(redis_url: str) -> None:
    """A field far longer than the known pods' loads is dropped unread, only known pods are
    kept, and one round parses at most `MAX_ROUND_BYTES` (64 fields of 54 KiB held the event
    loop 117 ms every 20 ms)."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        board = ReplicaLoadBoard(client, "ns/pool", key_prefix="test")
        seconds, micros = await client.time()
        stamp = str(seconds * 1000 + micros // 1000).encode()
        padded = {"p": [1, 1, 1, 1], **{f"ghost-{i}": [0, 0, 0, 0] for i in range(3000)}}
        await client.hset(board.key, "padded", stamp + b"|" + json.dumps(padded).encode())
        await client.hset(board.key, "extra", stamp + b'|{"p":[2,0,0,0],"ghost":[9,9,9,9]}')
        seen = await board.exchange("a", {"p": (0, 0, 0, 0)}, ttl_seconds=5.0, max_replicas=8)
        assert seen == {"extra": {"p": (2, 0, 0, 0)}}
        many = {f"pod-{i}": (0, 0, 0, 0) for i in range(6000)}  # ~150 KiB a field
        for replica in range(10):
            await board.exchange(f"r{replica}", many, ttl_seconds=5.0, max_replicas=16)
        seen = await board.exchange("a", many, ttl_seconds=5.0, max_replicas=16)
        field = len(json.dumps({p: list(v) for p, v in many.items()}, separators=(",", ":")))
        read = sum(r.startswith("r") for r in seen)
        assert 0 < read < 10 and read * field <= MAX_ROUND_BYTES
    finally:
        await client.aclose()
