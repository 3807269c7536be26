"""FallbackIndex over a real redis-server: the conformance suite, a stall (SIGSTOP) that loses
writes, and a restart that loses everything; afterwards Redis again says what the local view
(fed by the engines' events) holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry
from tests.integration.conftest import RedisServer
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.directory.fallback import FallbackIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex

TIMEOUT_SECONDS = 0.2


def fallback_over(url: str, clock: Callable[[], float], **kwargs: float) -> FallbackIndex:
    caps = {"max_blocks_per_pod": CAP, "max_approximate_per_pod": APPROX_CAP}
    metrics = DirectoryMetrics(CollectorRegistry())
    shared = RedisBlockIndex.from_url(
        url, "ns/pool", key_prefix="fb", socket_timeout_seconds=TIMEOUT_SECONDS, clock=clock, **caps
    )
    return FallbackIndex(
        shared,
        MemoryBlockIndex(clock=clock, **caps),
        metrics.fallback_errors,
        metrics.fallback_degraded,
        **kwargs,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def index(redis_url: str, clock: FakeClock) -> AsyncIterator[FallbackIndex]:
    fallback = fallback_over(redis_url, clock)
    yield fallback
    await fallback.close()


class TestFallbackOverRedisConformance(BlockIndexConformance):
    pass


async def wait_synced(index: FallbackIndex, seconds: float = 10.0) -> None:
    """Operate (as traffic would) until no pod is unsynced and the index is not degraded."""
    deadline = time.monotonic() + seconds
    while index.unsynced or index.degraded or index.resync_task is not None:
        assert time.monotonic() < deadline, f"not resynced: {index.unsynced}"
        await index.lookup(chain(1, "tick"))
        await asyncio.sleep(0.05)


async def until_rebuilt(
    index: FallbackIndex, reader: RedisBlockIndex, keys: list[bytes], expected: dict[str, int]
) -> None:
    """Send lookups (traffic lets the audit run) until Redis itself says `expected`."""
    deadline = time.monotonic() + 10
    while await reader.lookup(keys) != expected:
        assert time.monotonic() < deadline, "not rebuilt"
        await index.lookup(keys)
        await asyncio.sleep(0.1)


async def test_a_stall_loses_writes_and_the_rebuild_restores_them(
    redis_server_factory: Callable[[], RedisServer],
) -> None:
    server = redis_server_factory()
    index = fallback_over(server.url, time.time, resync_interval=0.2)
    reader = RedisBlockIndex.from_url(server.url, "ns/pool", key_prefix="fb")
    keys = chain(40)
    try:
        await index.set_generation("a", "g")
        await index.add("a", keys[:10], generation="g")
        await index.add("b", keys[:5])
        server.pause()
        started = time.monotonic()
        await index.add("a", keys[10:30], generation="g")  # times out: lost in Redis
        await index.add("a", keys[:1], generation="g")  # a second copy of block 0, lost too
        await index.remove("b", keys[2:5])
        await index.add_approximate("c", keys[:7], 60)
        assert await index.lookup(keys) == {"a": 30, "b": 2, "c": 7}  # the local view
        stalled = time.monotonic() - started
        server.resume()
        assert stalled < 6 * TIMEOUT_SECONDS  # each call waited one timeout at most
        await wait_synced(index)
        assert await reader.lookup(keys) == {"a": 30, "b": 2, "c": 7}
        assert await reader.get_generation("a") == "g"
        await reader.remove("a", keys[:1])  # the rebuild kept both copies
        assert await reader.lookup(keys, ["a"]) == {"a": 30}
        await reader.remove("a", keys[:1])
        assert await reader.lookup(keys, ["a"]) == {}
    finally:
        server.resume()
        await index.close()
        await reader.close()


Restartable = tuple[RedisServer, FallbackIndex, RedisBlockIndex]


@pytest.fixture
async def restartable(
    redis_server_factory: Callable[[], RedisServer],
) -> AsyncIterator[Restartable]:
    """A redis-server of its own, a fallback index over it auditing every 0.5 s, and a reader
    of what Redis itself says."""
    server = redis_server_factory()
    index = fallback_over(server.url, time.time, resync_interval=0.2, audit_interval=0.5)
    reader = RedisBlockIndex.from_url(server.url, "ns/pool", key_prefix="fb")
    yield server, index, reader
    await index.close()
    await reader.close()


async def test_a_redis_restart_that_lost_everything_is_rebuilt(restartable: Restartable) -> None:
    server, index, reader = restartable
    keys = chain(20)
    await index.set_generation("a", "g")
    await index.add("a", keys, generation="g")
    await index.add_approximate("b", keys[:4], 60)
    server.stop()
    server.start()  # same port, empty: no persistence
    assert await reader.lookup(keys) == {}
    await until_rebuilt(index, reader, keys, {"a": 20, "b": 4})
    assert await reader.get_generation("a") == "g"


async def test_a_restart_seen_only_through_a_later_write_is_rebuilt_all_the_same(
    restartable: Restartable,
) -> None:
    """Redis restarts between two calls: nothing fails, and the next write re-creates the pod
    with that write's entries only. Judged by which pods Redis lacked, the audit found none
    missing and the pod's earlier blocks were lost for good; the epoch tells."""
    server, index, reader = restartable
    keys = chain(20)
    await index.set_generation("a", "g")
    await index.add("a", keys[:10], generation="g")
    await asyncio.sleep(0.6)
    await index.lookup(keys)  # the first audit (after audit_interval) reads the epoch
    await wait_synced(index)
    server.stop()
    server.start()  # same port, empty: no persistence
    await index.add("a", keys[10:], generation="g")  # raises nothing: the client reconnects
    assert await reader.lookup(keys[10:]) == {"a": 10}
    await until_rebuilt(index, reader, keys, {"a": 20})


async def test_a_restart_before_the_first_audit_interval_is_rebuilt_all_the_same(
    redis_server_factory: Callable[[], RedisServer],
) -> None:
    """The epoch was first read one audit interval (30 s) after start: a Redis that restarted
    empty before then was taken for the original, and the pod's earlier blocks were lost for
    good. It is read before the first write."""
    server = redis_server_factory()
    index = fallback_over(server.url, time.time, resync_interval=0.2, audit_interval=2.0)
    reader = RedisBlockIndex.from_url(server.url, "ns/pool", key_prefix="fb")
    try:
        keys = chain(20)
        await index.set_generation("a", "g")
        await index.add("a", keys[:10], generation="g")
        await wait_synced(index)  # the audit the first call started is done
        server.stop()
        server.start()  # same port, empty: no persistence
        await index.add("a", keys[10:], generation="g")
        await until_rebuilt(index, reader, keys, {"a": 20})
    finally:
        await index.close()
        await reader.close()


Replicas = tuple[FallbackIndex, FallbackIndex, RedisBlockIndex]


@pytest.fixture
async def replicas(
    redis_server_factory: Callable[[], RedisServer],
) -> AsyncIterator[Callable[[float], Replicas]]:
    """`replicas(silence)`: two router replicas' indexes over one redis-server of their own
    (`owner_silence_seconds` = silence) and a reader of what Redis itself says; closed at the
    end (closing twice is fine)."""
    server = redis_server_factory()
    made: list[Replicas] = []

    def make(silence: float) -> Replicas:
        indexes = [
            fallback_over(server.url, time.time, owner_silence_seconds=silence) for _ in "ab"
        ]
        reader = RedisBlockIndex.from_url(server.url, "ns/pool", key_prefix="fb")
        made.append((indexes[0], indexes[1], reader))
        return made[-1]

    yield make
    for group in made:
        for index in group:
            await index.close()


async def test_a_replica_takes_a_pod_over_from_one_that_stopped(
    replicas: Callable[[float], Replicas],
) -> None:
    """Router replicas each index every pod's events; the last to start owns the pod in Redis
    and the others' writes are refused. When that replica stopped (scaled down, killed), its
    generation held the pod for good: no prefix the pod computed after it was ever seen again
    by any replica. A replica whose writes are refused takes the pod over, from its own view,
    once the owner missed writing an event; not while it writes."""
    first, last, reader = replicas(0.5)
    keys = chain(12)
    await first.set_generation("p", "first")
    await first.add("p", keys[:4], generation="first")
    await last.set_generation("p", "last")  # the last to start owns the pod
    await last.add("p", keys[:4], generation="last")
    for n in (6, 8):  # both get the same events; the owner writes them
        await asyncio.sleep(0.3)
        for index, generation in ((first, "first"), (last, "last")):
            await index.add("p", keys[n - 2 : n], generation=generation)
    assert await reader.get_generation("p") == "last"  # it writes: still the owner
    await last.close()  # it stopped
    for n in range(9, 13):  # the events go on: refused until the owner is found silent
        await asyncio.sleep(0.3)
        await first.add("p", keys[n - 1 : n], generation="first")
        await wait_synced(first)
    assert await reader.get_generation("p") == "first"
    assert await reader.lookup(keys) == {"p": 12}


async def test_a_pod_with_sparse_events_is_taken_over_from_an_owner_that_stopped(
    replicas: Callable[[float], Replicas],
) -> None:
    """Events further apart than the owner's silence (a lightly used pod): a refusal that came
    long after the previous one started the wait over, so the owner was never asked and its
    generation held the pod for good."""
    first, last, reader = replicas(0.2)
    keys = chain(8)
    await first.set_generation("p", "first")
    await last.set_generation("p", "last")
    await last.close()  # it stopped
    await asyncio.sleep(0.3)
    for n in range(1, 9):  # one event every 0.7 s
        await first.add("p", keys[n - 1 : n], generation="first")
        await wait_synced(first)
        if await reader.get_generation("p") == "first":
            break
        await asyncio.sleep(0.7)
    assert await reader.get_generation("p") == "first"
    assert n <= 3 and await reader.lookup(keys[:n]) == {"p": n}


async def test_an_owner_that_writes_after_a_quiet_spell_keeps_its_pod(
    replicas: Callable[[float], Replicas],
) -> None:
    """After a quiet spell the replica that does not own the pod may write the next event a
    moment before the owner: asked then, the owner looked silent and lost the pod (a whole
    rebuild each time). It is asked later, about the writes from a while before its own."""
    other, owner, reader = replicas(0.5)
    keys = chain(40)
    await other.set_generation("p", "other")
    await owner.set_generation("p", "owner")
    await asyncio.sleep(1.6)  # quiet
    for n in range(1, 13):  # then events flow, the other replica first each time
        await other.add("p", keys[n - 1 : n], generation="other")
        await asyncio.sleep(0.005)
        await owner.add("p", keys[n - 1 : n], generation="owner")
        await asyncio.sleep(0.1)
    assert await reader.get_generation("p") == "owner"
    assert not other.unsynced
    # A clear it applies (an AllBlocksCleared) reaches its own view, which it would rebuild
    # Redis from, and leaves the owner's entries alone.
    await other.clear_pod("p", generation="other")
    assert await other.local.lookup(keys) == {}
    assert await reader.lookup(keys) == {"p": 12}


async def test_a_router_rebuilding_its_history_leaves_the_indexers_exact_entries(
    restartable: Restartable,
) -> None:
    """A router beside a `kvgate indexer` writes only routing history of the pods; when Redis
    lost everything, its rebuild began with a clear of the pod, which wiped the entries the
    indexer had just rebuilt (and no event ever announces them again)."""
    server, indexer, reader = restartable
    router = fallback_over(server.url, time.time, resync_interval=0.2, audit_interval=0.5)
    exact, history = chain(20), chain(3, "history")
    try:
        await indexer.set_generation("p", "g1")
        await indexer.add("p", exact, generation="g1")
        await router.add_approximate("p", history, 60)
        for index in (indexer, router):
            assert await index.resync()  # each reads the epoch
        server.stop()
        server.start()  # same port, empty: no persistence
        for index in (indexer, router):  # the indexer first: the order that lost its entries
            await index.resync()
        assert await reader.lookup(exact) == {"p": 20}
        assert await reader.lookup(history) == {"p": 3}
        assert await reader.get_generation("p") == "g1"
    finally:
        await router.close()
