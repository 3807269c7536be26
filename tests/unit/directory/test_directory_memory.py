"""The memory backend against the conformance suite, plus what only it can show."""

from __future__ import annotations

import pytest
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.directory.base import BlockIndex
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


def test_bad_caps_are_rejected() -> None:
    with pytest.raises(ValueError):
        MemoryBlockIndex(max_blocks_per_pod=0)
