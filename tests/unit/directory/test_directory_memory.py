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
    check_only_the_owners_writes_show_it_alive,
)
from tests.unit.loop_turns import other_task_turns

from kvgate.directory import memory
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


async def test_a_clear_cancelled_halfway_still_erases_and_frees_its_slot() -> None:
    """A subscription stopped while it cleared its pod: the erase goes on by itself (cancelled
    halfway, the slot was never freed and its keys stayed in the forward index for good)."""
    index = MemoryBlockIndex()
    keys = chain(40_000)
    for start in range(0, len(keys), 4096):
        await index.add("a", keys[start : start + 4096], generation="g0")
    clearing = asyncio.create_task(index.set_generation("a", "g1"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the erase is under way
    clearing.cancel()
    await asyncio.gather(clearing, return_exceptions=True)
    await asyncio.gather(*index._erasing)
    await index.forget_pod("a")
    assert index._masks == {} and sorted(index._free_slots) == list(range(index._next_slot))


async def test_a_lookup_collects_a_bounded_share_of_expired_history_and_never_counts_it(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """After an idle longer than the TTL every entry had expired, and the next lookup collected
    all of every pod's in one go (0.41 s for 8 pods of 100k): a lookup collects a bounded
    share, and the rest still never counts."""
    monkeypatch.setattr(memory, "COLLECT_PER_LOOKUP", 5)
    index = MemoryBlockIndex(max_approximate_per_pod=100, clock=clock)
    keys = chain(20)
    await index.add("a", keys[:3])  # exact: never expires
    for pod in ("a", "b"):
        await index.add_approximate(pod, keys, ttl_seconds=60)
    assert await index.lookup(keys) == {"a": 20, "b": 20}
    clock.advance(61)
    assert await index.lookup(keys) == {"a": 3}  # 5 of 37 expired entries collected
    left = sum(len(state.approx) for state in index._pods.values())
    assert left == 37 - 5
    for _ in range(8):
        assert await index.lookup(keys) == {"a": 3}
    assert sum(len(state.approx) for state in index._pods.values()) == 0


async def test_a_write_after_an_idle_collects_a_bounded_share_of_expired_history(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """The routing history written after each decision collected all of its pod's expired
    entries (41 ms for 100k after an idle past the TTL): as many as a lookup, the cap the rest."""
    monkeypatch.setattr(memory, "COLLECT_PER_LOOKUP", 5)
    index = MemoryBlockIndex(max_approximate_per_pod=100, clock=clock)
    await index.add_approximate("a", chain(30), ttl_seconds=60)
    clock.advance(61)
    await index.add_approximate("a", chain(2, "new"), ttl_seconds=60)
    assert len(index._pods["a"].approx) == 30 - 5 + 2
    assert await index.lookup(chain(2, "new")) == {"a": 2}
    assert await index.lookup(chain(30)) == {}


async def test_a_clear_works_driven_by_hand() -> None:
    """The discrete-event bench drives the router's coroutines by hand (under a caller's
    event loop or none): an erase there runs inline, never waiting on a task."""

    def complete(coroutine):  # type: ignore[no-untyped-def]
        try:
            while coroutine.send(None) is None:
                pass
        except StopIteration as done:
            return done.value
        raise AssertionError("the coroutine waited on something")

    index = MemoryBlockIndex()
    complete(index.add("a", chain(3), generation="g0"))
    assert complete(index.set_generation("a", "g1")) is True
    assert complete(index.lookup(chain(3))) == {} and index._masks == {}


async def test_only_the_owners_writes_show_it_alive() -> None:
    clock = FakeClock()
    index = MemoryBlockIndex(clock=clock)

    async def pass_time(seconds: float) -> None:
        clock.advance(seconds)

    await check_only_the_owners_writes_show_it_alive(index, pass_time)
