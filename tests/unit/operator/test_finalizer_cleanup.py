"""Clearing a pool from the directory: complete when it works, bounded when it cannot."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvgate.directory.memory import MemoryBlockIndex
from kvgate.operator.cleanup import RedisTarget, clear_pool, forget_all_pods

TARGET = RedisTarget(url="redis://127.0.0.1:9/0", key_prefix="kvgate")


async def test_forget_all_pods_empties_the_index() -> None:
    index = MemoryBlockIndex()
    for pod in ("a", "b", "c"):
        await index.set_generation(pod, "g1")
        await index.add(pod, [bytes([1]) * 32, bytes([2]) * 32])
    assert await forget_all_pods(index) == 3
    assert await index.pods() == set()
    assert await index.lookup([bytes([1]) * 32]) == {}


async def test_clear_pool_uses_the_pool_key_and_closes() -> None:
    index = MemoryBlockIndex()
    await index.set_generation("p", "g")
    seen: list[str] = []

    def factory(target: RedisTarget, pool_key: str, timeout: float) -> MemoryBlockIndex:
        seen.append(pool_key)
        return index

    assert await clear_pool(TARGET, "ns/pool", timeout_seconds=1, factory=factory) == 1
    assert seen == ["ns/pool"]


async def test_a_hanging_directory_times_out() -> None:
    class Hanging(MemoryBlockIndex):
        async def pods(self) -> set[str]:
            await asyncio.sleep(3600)
            return set()

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await clear_pool(TARGET, "ns/p", timeout_seconds=0.2, factory=lambda *_: Hanging())
    assert time.monotonic() - started < 2


async def test_unreachable_redis_fails_fast() -> None:
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017  (connection refused, whatever the client raises)
        await clear_pool(TARGET, "ns/p", timeout_seconds=1.0)
    assert time.monotonic() - started < 3
