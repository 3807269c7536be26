"""Ingest of vLLM BlockStored events into the directory (targets: >= 300k blocks/s into memory,
>= 50k blocks/s into Redis, per process).

    .venv/bin/python -m pytest benchmarks/test_directory_ingest.py --benchmark-only -q -s

The whole indexer path minus the socket: messages `[topic, seq, payload]` go through
`PodSubscriber.handle_many` (seq tracking, msgpack decode of vLLM 0.33's map-encoded batch,
32-byte hashes to block keys, coalesced directory writes). A batch holds 4 BlockStored events of
32 blocks. `backlog=1`: one message per call (an idle indexer keeping up); `backlog=32`: the
subscriber drains 32 queued messages per write, as its run loop does when events arrive faster
than one write per message.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq.asyncio
from benchmarks.directory_common import chain, redis_server, report
from tests.integration.conftest import RedisServer

from kvgate.directory.base import BlockIndex
from kvgate.directory.events import BlockStored, EventBatch, encode_batch
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.redis import RedisBlockIndex
from kvgate.directory.subscriber import PodEndpoint, PodSubscriber

__all__ = ["redis_server"]
PODS = 4
EVENTS_PER_BATCH = 4
BLOCKS_PER_EVENT = 32


def _messages(batches: int) -> list[list[bytes]]:
    keys = chain(batches * EVENTS_PER_BATCH * BLOCKS_PER_EVENT, "ingest")
    out = []
    for seq in range(batches):
        events = []
        for e in range(EVENTS_PER_BATCH):
            first = (seq * EVENTS_PER_BATCH + e) * BLOCKS_PER_EVENT
            block = keys[first : first + BLOCKS_PER_EVENT]
            events.append(
                BlockStored(
                    block,
                    keys[first - 1] if first else None,
                    list(range(16 * BLOCKS_PER_EVENT)),
                    16,
                )
            )
        payload = encode_batch(EventBatch(float(seq), events, 0))
        out.append([b"kv", seq.to_bytes(8, "big"), payload])
    return out


async def _ingest(index: BlockIndex, messages: list[list[bytes]], backlog: int) -> float:
    ctx = zmq.asyncio.Context()
    try:
        subs = [
            PodSubscriber(PodEndpoint(f"pod-{p}", "tcp://127.0.0.1:1", topic="kv"), index, ctx)
            for p in range(PODS)
        ]
        for sub in subs:
            await index.set_generation(sub.endpoint.pod, sub.generation)
        start = time.perf_counter()
        for sub in subs:
            for i in range(0, len(messages), backlog):
                await sub.handle_many(messages[i : i + backlog])
        elapsed = time.perf_counter() - start
    finally:
        ctx.destroy(linger=0)
    stats = await index.stats()
    assert stats.entries == PODS * len(messages) * EVENTS_PER_BATCH * BLOCKS_PER_EVENT
    return PODS * len(messages) * EVENTS_PER_BATCH * BLOCKS_PER_EVENT / elapsed


@pytest.mark.parametrize("backlog", [1, 32])
def test_ingest_memory(benchmark, backlog):
    messages = _messages(600)
    rates = [asyncio.run(_ingest(MemoryBlockIndex(), messages, backlog)) for _ in range(3)]
    benchmark.extra_info["blocks_per_second"] = max(rates)
    report(
        f"memory ingest BlockStored (backlog {backlog})",
        {"blocks_per_s_best": max(rates), "blocks_per_s_worst": min(rates)},
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.parametrize("backlog", [1, 32])
def test_ingest_redis(benchmark, backlog, redis_server: RedisServer):
    messages = _messages(150)

    async def once() -> float:
        redis_server.flushall()
        index = RedisBlockIndex.from_url(redis_server.url, "bench/ingest")
        try:
            return await _ingest(index, messages, backlog)
        finally:
            await index.close()

    rates = [asyncio.run(once()) for _ in range(3)]
    benchmark.extra_info["blocks_per_second"] = max(rates)
    report(
        f"redis ingest BlockStored (backlog {backlog})",
        {"blocks_per_s_best": max(rates), "blocks_per_s_worst": min(rates)},
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
