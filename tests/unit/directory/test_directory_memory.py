"""The memory backend against the conformance suite, plus what only it can show."""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)
from tests.unit.loop_turns import other_task_turns

from kvgate.directory.base import HISTORY_CHUNK_KEYS, BlockIndex
from kvgate.directory.memory import MemoryBlockIndex


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def index(clock: FakeClock) -> MemoryBlockIndex:
    return MemoryBlockIndex(max_blocks_per_pod=CAP, max_approximate_per_pod=APPROX_CAP, clock=clock)


class TestMemoryConformance(BlockIndexConformance):
    pass


def test_satisfies_protocol(index: MemoryBlockIndex) -> None:
    assert isinstance(index, BlockIndex)


async def test_cleared_slots_are_reused_without_leaking_bits(index: MemoryBlockIndex) -> None:
    keys = chain(10)
    for generation in range(50):
        await index.set_generation("a", f"g{generation}")
        await index.add("a", keys)
        await index.add("b", keys[:5])
    assert await index.lookup(keys) == {"a": 10, "b": 5}
    # only two slots ever needed at once (plus one while a clear is in flight)
    assert index._next_slot <= 3


async def test_exact_eviction_keeps_newest(index: MemoryBlockIndex) -> None:
    old, new = chain(CAP, "old"), chain(CAP, "new")
    await index.add("a", old)
    await index.add("a", new)
    assert await index.lookup(new) == {"a": CAP}
    assert await index.lookup(old) == {}


async def test_only_keys_with_copies_cost_more(index: MemoryBlockIndex) -> None:
    """One copy is a bit in the media mask, as before copies were counted; the overflow map
    holds only keys with more, and loses them with their last extra copy or their eviction."""
    keys = chain(CAP)
    await index.add("a", keys)
    state = index._pods["a"]
    assert not any(state.copies.values())
    await index.add("a", keys[:3])
    await index.add("a", keys[:1], medium="CPU")
    assert sum(map(len, state.copies.values())) == 3
    await index.remove("a", keys[:3])
    assert not any(state.copies.values())
    await index.add("a", keys[:2] * 3)
    await index.add("a", chain(CAP, "new"))  # evicts every old key
    assert not any(state.copies.values())


async def test_a_long_routing_history_is_written_with_the_loop_free_between_chunks() -> None:
    index = MemoryBlockIndex(max_approximate_per_pod=10 * HISTORY_CHUNK_KEYS)
    keys = chain(3 * HISTORY_CHUNK_KEYS + 5, "long")
    async with other_task_turns() as turns:
        await index.add_approximate("a", keys, ttl_seconds=60)
    assert turns() >= 3  # once per chunk after the first, at least
    assert await index.lookup(keys) == {"a": len(keys)}


async def test_a_pod_cleared_during_a_long_write_keeps_none_of_the_rest() -> None:
    index = MemoryBlockIndex(max_approximate_per_pod=10 * HISTORY_CHUNK_KEYS)
    keys = chain(3 * HISTORY_CHUNK_KEYS, "long")
    write = asyncio.create_task(index.add_approximate("a", keys, ttl_seconds=60))
    await asyncio.sleep(0)  # the first chunk is written
    await index.clear_pod("a")
    await write
    assert await index.lookup(keys) == {}
    assert (await index.stats()).approximate_entries == 0


async def test_the_least_recently_written_approximate_entries_go_first(
    index: MemoryBlockIndex,
) -> None:
    old, new = chain(APPROX_CAP, "old"), chain(APPROX_CAP // 2, "new")
    await index.add_approximate("a", old, ttl_seconds=60)
    await index.add_approximate("a", old[:2], ttl_seconds=60)  # rewritten: the newest
    await index.add_approximate("a", new, ttl_seconds=60)
    assert await index.lookup(new) == {"a": len(new)}
    assert await index.lookup(old[:2]) == {"a": 2}
    assert await index.lookup(old) == {"a": 2}  # old[2] was among the least recent


def test_bad_caps_are_rejected() -> None:
    with pytest.raises(ValueError):
        MemoryBlockIndex(max_blocks_per_pod=0)
