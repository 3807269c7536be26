"""FallbackIndex: the conformance suite over a memory "shared" index, and what happens when the
shared index fails: a lost write, a lost forget, an outage, a rebuild racing new writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex
from kvgate.directory.fallback import FallbackIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics


class FlakyIndex(MemoryBlockIndex):
    """A memory index standing in for Redis: `down` makes every call raise; `gate`, when set
    to an unset Event, holds `add` calls until it is set (a slow Redis)."""

    down = False
    gate: asyncio.Event | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []
        self.held = asyncio.Event()  # set once an `add` waits at the gate

    def hold(self) -> None:
        """Hold every `add` from now on until `release`."""
        self.gate = asyncio.Event()
        self.held.clear()

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()

    async def until_held(self) -> None:
        await asyncio.wait_for(self.held.wait(), 5)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise ConnectionError("redis down")

    async def lookup(
        self, keys: Sequence[bytes], pods: Any = None, *, medium: str | None = None
    ) -> dict[str, int]:
        self._call("lookup")
        return await super().lookup(keys, pods, medium=medium)

    async def add(self, pod: str, keys: Sequence[bytes], **kwargs: Any) -> bool:
        self._call("add")
        if self.gate is not None:
            self.held.set()
            await self.gate.wait()
        return await super().add(pod, keys, **kwargs)

    async def remove(self, pod: str, keys: Sequence[bytes], **kwargs: Any) -> bool:
        self._call("remove")
        return await super().remove(pod, keys, **kwargs)

    async def add_approximate(self, pod: str, keys: Sequence[bytes], ttl_seconds: float) -> None:
        self._call("add_approximate")
        await super().add_approximate(pod, keys, ttl_seconds)

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        self._call("clear_pod")
        await super().clear_pod(pod, generation=generation)

    async def forget_pod(self, pod: str) -> None:
        self._call("forget_pod")
        await super().forget_pod(pod)

    async def set_generation(self, pod: str, generation: str) -> bool:
        self._call("set_generation")
        return await super().set_generation(pod, generation)

    async def pods(self) -> set[str]:
        self._call("pods")
        return await super().pods()


class Clocks:
    """The wall clock both indexes read (expiry) and the monotonic one of the fallback (resync)."""

    def __init__(self) -> None:
        self.wall = FakeClock()
        self.mono = 0.0

    def advance(self, seconds: float) -> None:
        self.wall.advance(seconds)
        self.mono += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def make(
    registry: CollectorRegistry, wall: FakeClock, mono: Any, **kwargs: Any
) -> tuple[FallbackIndex, FlakyIndex]:
    metrics = DirectoryMetrics(registry)
    caps = {"max_blocks_per_pod": CAP, "max_approximate_per_pod": APPROX_CAP, "clock": wall}
    shared = FlakyIndex(**caps)
    index = FallbackIndex(
        shared,
        MemoryBlockIndex(**caps),
        metrics.fallback_errors,
        metrics.fallback_degraded,
        resync_interval=1.0,
        clock=mono,
        **kwargs,
    )
    return index, shared


@pytest.fixture
async def index(registry: CollectorRegistry, clock: FakeClock) -> AsyncIterator[FallbackIndex]:
    fallback, _shared = make(registry, clock, lambda: 0.0)
    yield fallback
    await fallback.close()


class TestFallbackConformance(BlockIndexConformance):
    """With a healthy shared index the fallback is indistinguishable from it."""


@pytest.fixture
async def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
async def pair(
    registry: CollectorRegistry, clocks: Clocks
) -> AsyncIterator[tuple[FallbackIndex, FlakyIndex]]:
    fallback, shared = make(registry, clocks.wall, lambda: clocks.mono)
    yield fallback, shared
    await fallback.close()


def errors(registry: CollectorRegistry, operation: str) -> float:
    value = registry.get_sample_value(
        "kvgate_directory_fallback_errors_total", {"operation": operation}
    )
    return value or 0.0


async def settle(index: FallbackIndex) -> None:
    """Let a resync task that an operation started run to its end."""
    for _ in range(100):
        task = index.resync_task
        if task is None:
            return
        await asyncio.wait_for(asyncio.shield(task), 5)
    raise AssertionError("resync never settled")


async def test_a_lost_write_degrades_nobody_and_is_rebuilt(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks, registry: CollectorRegistry
) -> None:
    index, shared = pair
    keys = chain(6)
    await index.set_generation("a", "g1")
    await index.add("a", keys[:2])
    await index.add("b", keys)
    shared.down = True
    await index.add("a", keys[2:4])  # lost in Redis: "a" is unsynced
    await index.remove("b", keys[3:])  # lost too
    shared.down = False
    assert not index.degraded
    assert index.unsynced == {"a", "b"}
    assert await shared.lookup(keys) == {"a": 2, "b": 6}  # what Redis says now: stale
    # Lookups still go to Redis, and answer for unsynced pods from the local view.
    assert await index.lookup(keys) == {"a": 4, "b": 3}
    assert shared.calls.count("lookup") == 2
    await index.add("a", keys[4:5])  # unsynced: skips Redis (the rebuild will carry it)
    assert await shared.lookup(keys) == {"a": 2, "b": 6}
    clocks.advance(1.0)  # the resync interval: the next operation starts the rebuild
    await index.lookup(keys)
    await settle(index)
    assert index.unsynced == set()
    assert await shared.lookup(keys) == {"a": 5, "b": 3}  # Redis says what the engines hold
    assert await shared.get_generation("a") == "g1"
    assert errors(registry, "add") == 1 and errors(registry, "remove") == 1
    assert registry.get_sample_value("kvgate_directory_fallback_degraded") == 0


async def test_rebuild_keeps_media_and_remaining_ttls(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    keys = chain(4)
    await index.add("a", keys[:1], medium="CPU")
    shared.down = True
    await index.add("a", keys[:2])
    await index.add_approximate("a", keys[2:3], 10)
    clocks.advance(4)
    await index.add_approximate("a", keys[3:4], 30)
    shared.down = False
    clocks.advance(1.0)
    assert await index.resync()
    assert await shared.lookup(keys) == {"a": 4}
    clocks.advance(5.5)  # keys[2] was added 10.5 s ago with a 10 s ttl: gone in both
    assert await shared.lookup(keys) == await index.local.lookup(keys) == {"a": 2}
    await shared.remove("a", keys[:1])  # GPU copy of keys[0] left; CPU copy was rebuilt too
    assert await shared.lookup(keys[:1]) == {"a": 1}
    await shared.remove("a", keys[:1], medium="CPU")
    assert await shared.lookup(keys[:1]) == {}


async def test_rebuild_keeps_copies(pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks) -> None:
    index, shared = pair
    keys = chain(3)
    await index.add("a", keys)
    shared.down = True
    await index.add("a", keys[:1])  # a second GPU copy of block 0, lost in Redis
    await index.add("a", [keys[1], keys[1]], medium="CPU")  # two CPU copies of block 1
    shared.down = False
    clocks.advance(1.0)
    assert await index.resync()
    await shared.remove("a", keys[:1])
    assert await shared.lookup(keys) == {"a": 3}  # the rebuilt second copy is still held
    await shared.remove("a", keys[:1])
    assert await shared.lookup(keys) == {}
    await shared.remove("a", keys[1:2], medium="CPU")
    assert await shared.lookup(keys[1:], medium="CPU") == {"a": 1}
    await shared.remove("a", keys[1:2], medium="CPU")
    assert await shared.lookup(keys[1:], medium="CPU") == {}


async def test_a_lost_forget_is_retried(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    await index.set_generation("gone", "g")
    await index.add("gone", chain(3))
    shared.down = True
    await index.forget_pod("gone")
    shared.down = False
    assert await index.pods() == set()  # unsynced: the local view answers for it
    assert await shared.pods() == {"gone"}
    clocks.advance(1.0)
    assert await index.resync()
    assert await shared.pods() == set()
    assert await shared.get_generation("gone") is None


async def test_forget_then_new_writes_rebuild_the_new_pod(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    keys = chain(3)
    await index.set_generation("p", "old")
    await index.add("p", keys)
    shared.down = True
    await index.forget_pod("p")
    shared.down = False
    await index.set_generation("p", "new")  # unsynced: local only
    await index.add("p", keys[:1], generation="new")
    clocks.advance(1.0)
    assert await index.resync()
    assert await shared.get_generation("p") == "new"
    assert await shared.lookup(keys) == {"p": 1}


async def test_repeated_lookup_failures_degrade_then_recover(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks, registry: CollectorRegistry
) -> None:
    index, shared = pair
    keys = chain(2)
    await index.add("a", keys)
    shared.down = True
    for expected in ({"a": 2}, {"a": 2}, {"a": 2}):
        assert await index.lookup(keys) == expected  # from the local view
    assert index.degraded
    assert registry.get_sample_value("kvgate_directory_fallback_degraded") == 1
    calls = len(shared.calls)
    await index.lookup(keys)
    await index.add("b", keys)  # degraded: neither call waits on Redis
    assert len(shared.calls) == calls
    assert index.unsynced == {"b"}
    shared.down = False
    clocks.advance(0.5)
    await index.lookup(keys)  # before the interval: no probe yet
    assert index.degraded and index.resync_task is None
    clocks.advance(0.5)
    await index.lookup(keys)
    await settle(index)
    assert not index.degraded
    assert registry.get_sample_value("kvgate_directory_fallback_degraded") == 0
    assert await shared.lookup(keys) == {"a": 2, "b": 2}
    assert errors(registry, "lookup") == 3


async def test_a_writer_that_never_looks_up_recovers(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    """`kvgate indexer` only writes: its own writes must drive the resync."""
    index, shared = pair
    shared.down = True
    await index.add("a", chain(1))
    shared.down = False
    clocks.advance(1.0)
    await index.add("a", chain(2)[1:])
    await settle(index)
    assert await shared.lookup(chain(2)) == {"a": 2}
    assert index.unsynced == set()


async def test_writes_during_a_rebuild_are_replayed_after_it_in_order(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    keys = chain(4)
    shared.down = True
    await index.add("a", keys[:3])
    shared.down = False
    shared.hold()  # the rebuild's first add hangs until released
    clocks.advance(1.0)
    rebuild = asyncio.create_task(index.resync())
    await shared.until_held()
    await index.remove("a", keys[1:2])  # arrives mid-rebuild: queued, not lost
    await index.add("a", keys[3:])
    assert index.unsynced == {"a"}
    assert shared.calls.count("remove") == 0  # not yet: after the copy
    shared.release()
    assert await rebuild
    assert await shared.lookup(keys) == await index.local.lookup(keys) == {"a": 1}
    assert await shared.lookup(keys[3:]) == {"a": 1}


async def test_too_many_writes_during_a_rebuild_mean_another_rebuild(
    registry: CollectorRegistry, clocks: Clocks
) -> None:
    index, shared = make(registry, clocks.wall, lambda: clocks.mono, max_queued_writes=2)
    keys = chain(8)
    shared.down = True
    await index.add("a", keys[:1])
    shared.down = False
    shared.hold()
    clocks.advance(1.0)
    rebuild = asyncio.create_task(index.resync())
    await shared.until_held()
    for i in range(1, 5):
        await index.add("a", keys[i : i + 1])
    shared.release()
    assert not await rebuild  # "a" is unsynced again
    assert index.unsynced == {"a"}
    shared.gate = None
    assert await index.resync()
    assert await shared.lookup(keys) == {"a": 5}
    await index.close()


async def test_pods_redis_lost_without_an_error_are_rebuilt_by_the_audit(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    """A Redis that restarted empty between two calls raises nothing (the client reconnects)."""
    index, shared = pair
    await index.set_generation("a", "g")
    await index.add("a", chain(3))
    await shared.forget_pod("a")  # what an empty Redis looks like
    clocks.advance(29.0)
    await index.lookup(chain(3))
    assert index.resync_task is None
    clocks.advance(1.0)
    await index.lookup(chain(3))  # the audit is due: it probes and rebuilds in the background
    await settle(index)
    assert await shared.lookup(chain(3)) == {"a": 3}
    assert await shared.get_generation("a") == "g"


async def test_a_failing_rebuild_is_retried_later(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks, registry: CollectorRegistry
) -> None:
    index, shared = pair
    shared.down = True
    await index.add("a", chain(2))
    clocks.advance(1.0)
    assert not await index.resync()  # still down
    assert index.unsynced == {"a"}
    assert errors(registry, "resync") == 1
    await index.lookup(chain(2))
    assert index.resync_task is None  # the next try waits for the interval
    shared.down = False
    clocks.advance(1.0)
    await index.lookup(chain(2))
    await settle(index)
    assert await shared.lookup(chain(2)) == {"a": 2}


async def test_a_newer_shared_generation_wins_over_the_rebuild(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    await index.set_generation("a", "mine")
    shared.down = True
    await index.add("a", chain(2), generation="mine")
    shared.down = False
    # The rebuild sets "mine" again (a restarted indexer elsewhere would set its own later);
    # adds tagged with it apply.
    clocks.advance(1.0)
    assert await index.resync()
    assert await shared.lookup(chain(2)) == {"a": 2}
    assert await shared.get_generation("a") == "mine"


async def test_close_cancels_a_running_resync(
    pair: tuple[FallbackIndex, FlakyIndex], clocks: Clocks
) -> None:
    index, shared = pair
    shared.down = True
    await index.add("a", chain(1))
    shared.down = False
    shared.hold()  # never released: the rebuild hangs
    clocks.advance(1.0)
    await index.lookup(chain(1))
    task = index.resync_task
    assert task is not None
    await shared.until_held()
    await asyncio.wait_for(index.close(), 2)
    assert task.done()


def test_satisfies_protocol(index: FallbackIndex) -> None:
    assert isinstance(index, BlockIndex)
    assert DEFAULT_MEDIUM == "GPU"


async def test_a_rebuild_clears_nothing_of_a_writer_that_took_the_pod_meanwhile(
    pair: tuple[FallbackIndex, FlakyIndex],
) -> None:
    """Two replicas taking a pod over at once: the one whose generation landed first went on
    to clear the pod, wiping what the other (now the owner) had just written."""
    index, shared = pair
    mine, theirs = chain(4), chain(3, "theirs")
    await index.set_generation("p", "mine")
    shared.down = True
    await index.add("p", mine, generation="mine")  # lost: "p" is rebuilt from the local view
    shared.down = False
    take_pod = shared.set_generation

    async def then_taken(pod: str, generation: str) -> bool:
        changed = await take_pod(pod, generation)
        await take_pod(pod, "theirs")  # the other replica, right after
        await shared.add(pod, theirs, generation="theirs")
        return changed

    shared.set_generation = then_taken  # type: ignore[method-assign]
    await index.resync()
    assert await shared.get_generation("p") == "theirs"
    assert await shared.lookup(theirs) == {"p": 3}
