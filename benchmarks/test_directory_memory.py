"""Memory per (block, pod) entry: the memory backend (tracemalloc) and Redis (INFO memory).

    .venv/bin/python -m pytest benchmarks/test_directory_memory.py --benchmark-only -q -s

16 pods x 20,000 blocks = 320,000 exact (block, pod) entries, added in events of 128 blocks.
`distinct`: every pod holds its own blocks (no sharing: the forward index has one key per
entry). `shared`: all pods hold the same blocks (one forward-index key per 16 entries).
`copies`: as `distinct`, but every block is stored twice (a second event, with its own key
objects: vLLM caching the hash in two blocks), so every entry has a second copy.
The memory figure includes the block keys themselves (as decoded events would create them).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest
import redis.asyncio as aioredis
from benchmarks.directory_common import chain, redis_server, report
from tests.integration.conftest import RedisServer

from kvgate.directory.base import BlockIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.redis import RedisBlockIndex

__all__ = ["redis_server"]
PODS = 16
BLOCKS = 20_000
EVENT = 128


async def _fill(index: BlockIndex, layout: str) -> int:
    for pod in range(PODS):
        for _copy in range(2 if layout == "copies" else 1):
            keys = chain(BLOCKS, "shared" if layout == "shared" else f"pod{pod}")
            for i in range(0, BLOCKS, EVENT):
                await index.add(f"pod-{pod}", keys[i : i + EVENT])
    entries = (await index.stats()).entries
    assert entries == PODS * BLOCKS
    return entries


@pytest.mark.parametrize("layout", ["distinct", "shared", "copies"])
def test_memory_per_entry_memory_backend(benchmark, layout):
    gc.collect()
    tracemalloc.start()
    index = MemoryBlockIndex()
    entries = asyncio.run(_fill(index, layout))
    gc.collect()
    used, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_entry = used / entries
    benchmark.extra_info["bytes_per_entry"] = per_entry
    report(f"memory backend ({layout})", {"bytes_per_entry": per_entry, "entries": entries})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.parametrize("layout", ["distinct", "shared", "copies"])
def test_memory_per_entry_redis(benchmark, layout, redis_server: RedisServer):
    redis_server.flushall()

    async def run() -> tuple[int, int]:
        raw = aioredis.Redis.from_url(redis_server.url)
        index = RedisBlockIndex.from_url(redis_server.url, "bench/memory")
        try:
            before = (await raw.info("memory"))["used_memory"]
            entries = await _fill(index, layout)
            after = (await raw.info("memory"))["used_memory"]
            return after - before, entries
        finally:
            await index.close()
            await raw.aclose()

    used, entries = asyncio.run(run())
    per_entry = used / entries
    benchmark.extra_info["bytes_per_entry"] = per_entry
    report(f"redis ({layout})", {"bytes_per_entry": per_entry, "entries": entries})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
