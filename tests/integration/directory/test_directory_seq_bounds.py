"""Hostile or broken KV-event streams against a real ZMQ publisher and replay socket: a seq jump
of 2^62 costs O(1) memory, a replay socket that never ends its replay cannot hold the subscriber
past its deadline, seqs no vLLM counter reaches are counted and skipped, and megabytes of junk
events cost milliseconds, not seconds."""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import time
import tracemalloc
from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry
from tests.integration.directory.test_directory_subscriber import (
    FakeEngine,
    bad,
    connected,
    h,
    stored,
    until,
)

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.events import EventBatch, encode_batch
from kvgate.directory.indexer import SubscriptionManager
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.kvevents.decode import MAX_REJECTED_EVENTS

REPLAY_TIMEOUT_SECONDS = 1.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def manager(registry: CollectorRegistry) -> AsyncIterator[SubscriptionManager]:
    index = MemoryBlockIndex()
    mgr = SubscriptionManager(
        index,
        pool="ns/pool",
        metrics=DirectoryMetrics(registry),
        limits=KvEventsConfig(replay_timeout_seconds=REPLAY_TIMEOUT_SECONDS),
    )
    mgr.index = index  # type: ignore[attr-defined]
    yield mgr
    await mgr.close()


def counter(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"pool": "ns/pool", **labels}) or 0.0


async def lookup_is(index: MemoryBlockIndex, keys: list[bytes], want: dict[str, int]) -> bool:
    return await index.lookup(keys) == want


async def test_a_seq_jump_of_2_to_the_62_costs_constant_memory(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "kv@10.0.0.1@m")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0)))
    await until(lambda: lookup_is(index, [h(0)], {"p1": 1}))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        rss_before = rss_bytes()
        started = time.monotonic()
        engine.seq = 1 << 62
        await engine.publish(stored(h(1)))
        await until(lambda: lookup_is(index, [h(1)], {"p1": 1}))
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        rss_growth = rss_bytes() - rss_before
    finally:
        tracemalloc.stop()
    print(
        f"\n2^62 jump: peak +{(peak - before) / 1024:.0f} KiB traced, RSS "
        f"{rss_growth / 2**20:+.1f} MiB, handled in {elapsed:.3f} s"
    )
    assert peak - before < 2 * 1024 * 1024  # the old code asked for a 2^62-element list
    assert rss_growth < 32 * 1024 * 1024
    assert await index.lookup([h(0)]) == {}  # cleared: the jump is beyond any replay buffer
    assert counter(registry, "kvgate_directory_bad_events_total", reason="seq_jump") == 1
    assert counter(registry, "kvgate_directory_pod_clears_total", reason="gap") == 1
    assert manager.subscriber("p1").expected == (1 << 62) + 1  # type: ignore[union-attr]
    await engine.publish(stored(h(2)))  # and it follows the new seq
    await until(lambda: lookup_is(index, [h(1), h(2)], {"p1": 2}))
    await engine.close()


class EndlessReplay(FakeEngine):
    """A replay socket that answers a replay with a never-ending trickle of frames of old seqs
    (below the start asked for) and never sends the end marker."""

    async def _serve_replay(self) -> None:
        assert self.router is not None
        ident, _, _start = await self.router.recv_multipart()
        while True:
            await self.router.send_multipart([ident, b"", self.topic, (0).to_bytes(8, "big"), b""])
            await asyncio.sleep(0.005)


async def test_a_replay_that_never_ends_is_cut_off_at_its_deadline(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = EndlessReplay(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0)))
    await until(lambda: lookup_is(index, [h(0)], {"p1": 1}))
    await engine.publish(stored(h(1)), drop=True)
    started = time.monotonic()
    await engine.publish(stored(h(2)))  # a gap of one: replayed from the endless socket
    await until(lambda: lookup_is(index, [h(2)], {"p1": 1}))
    recovered = time.monotonic() - started
    print(f"endless replay: subscriber recovered after {recovered:.2f} s")
    assert REPLAY_TIMEOUT_SECONDS * 0.9 <= recovered <= REPLAY_TIMEOUT_SECONDS + 2.0
    assert await index.lookup([h(0)]) == {}  # incomplete: cleared
    assert counter(registry, "kvgate_directory_event_replays_total", outcome="failed") == 1
    await engine.publish(stored(h(3)))  # and the subscriber keeps going
    await until(lambda: lookup_is(index, [h(2), h(3)], {"p1": 2}))
    await engine.close()


async def test_negative_seqs_are_counted_and_skipped(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0)))
    payload = encode_batch(EventBatch(1.0, [stored(h(9))]))
    for seq in (-1, -(1 << 62), -(1 << 63)):
        await engine.pub.send_multipart([b"t", seq.to_bytes(8, "big", signed=True), payload])
    await engine.publish(stored(h(1)))
    await until(lambda: lookup_is(index, [h(0), h(1)], {"p1": 2}))
    assert await index.lookup([h(9)]) == {}
    assert bad(registry, "bad_seq") == 3
    assert bad(registry, "directory_error") == 0
    assert counter(registry, "kvgate_directory_event_seq_gaps_total") == 0
    await engine.close()


async def test_megabytes_of_junk_events_cost_milliseconds_and_later_events_apply(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    """Each junk event is one byte (msgpack 0, no event at all): before the decoder stopped at a
    batch's 64th rejection, each cost a rejection object and a log check on the event loop,
    seconds and hundreds of MB a message."""
    junk_events = 2 << 20
    junk = msgpack.packb([0.0, [0] * junk_events, 0])
    engine = FakeEngine(ctx, "kv@10.0.0.1@m")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    slowest = 0.0
    for i in range(3):
        started = time.monotonic()
        await engine.publish(payload=junk)
        await engine.publish(stored(h(i)))
        await until(functools.partial(lookup_is, index, [h(i)], {"p1": 1}))
        slowest = max(slowest, time.monotonic() - started)
    peak_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) * 1024
    print(f"\n2 MiB of junk events: {slowest:.3f} s, peak RSS {peak_growth / 2**20:+.0f} MiB")
    assert slowest < 1.0
    assert peak_growth < 256 * 1024 * 1024
    assert bad(registry, "malformed_event") == 3 * MAX_REJECTED_EVENTS
    assert bad(registry, "too_many_rejects") == 3 * (junk_events - MAX_REJECTED_EVENTS)
    # Each junk batch's unread events may have held a removal: it clears the pod, and the
    # events after it apply.
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(2)]) == {"p1": 1}
    await engine.close()
