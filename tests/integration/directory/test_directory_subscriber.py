"""KV-event subscribers against a real ZMQ publisher on loopback speaking vLLM's wire format."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry
from tests.integration.conftest import RedisServer

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    encode_batch,
)
from kvgate.directory.indexer import SubscriptionManager
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex
from kvgate.directory.subscriber import PodEndpoint

END = (-1).to_bytes(8, "big", signed=True)


def h(i: int, tag: str = "b") -> bytes:
    return hashlib.sha256(f"{tag}/{i}".encode()).digest()


def stored(*hashes: bytes | int, medium: str | None = None) -> BlockStored:
    return BlockStored(list(hashes), None, list(range(16 * len(hashes))), 16, medium=medium)


class FakeEngine:
    """vLLM's ZmqEventPublisher reduced to its wire format: PUB + ROUTER replay with a buffer."""

    def __init__(self, ctx: zmq.asyncio.Context, topic: str, *, replay: bool = True) -> None:
        self.topic = topic.encode()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.events_endpoint = f"tcp://127.0.0.1:{port}"
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self._server = asyncio.create_task(self._serve_replay()) if self.router else None

    def endpoint(self, pod: str) -> PodEndpoint:
        return PodEndpoint(pod, self.events_endpoint, self.replay_endpoint, self.topic.decode())

    async def publish(
        self, *events: KVEvent, drop: bool = False, payload: bytes | None = None
    ) -> int:
        seq, self.seq = self.seq, self.seq + 1
        data = (
            payload
            if payload is not None
            else encode_batch(EventBatch(float(seq), list(events), 0))
        )
        self.buffer.append((seq, data))
        if not drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), data])
        return seq

    def restart(self) -> None:
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, data in list(self.buffer):
                if seq >= first:
                    await self.router.send_multipart(
                        [ident, b"", self.topic, seq.to_bytes(8, "big"), data]
                    )
            await self.router.send_multipart([ident, b"", b"", END, b""])

    async def close(self) -> None:
        if self._server:
            self._server.cancel()
            await asyncio.gather(self._server, return_exceptions=True)
        self.pub.close(0)
        if self.router:
            self.router.close(0)


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
        limits=KvEventsConfig(replay_timeout_seconds=1.0),
    )
    mgr.index = index  # type: ignore[attr-defined]
    yield mgr
    await mgr.close()


async def until(
    check: Callable[[], Awaitable[bool]], tick: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Wait (≤ 10 s) for `check`; call `tick` (e.g. publish an empty batch) between tries."""
    for _ in range(200):
        if await check():
            return
        if tick:
            await tick()
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def connected(mgr: SubscriptionManager, engine: FakeEngine, pod: str) -> None:
    """Publish empty batches until the subscriber has seen one (ZMQ's slow-joiner)."""

    async def seen() -> bool:
        sub = mgr.subscriber(pod)
        return sub is not None and sub.expected is not None

    await until(seen, lambda: engine.publish())


def bad(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value(
            "kvgate_directory_bad_events_total", {"pool": "ns/pool", "reason": reason}
        )
        or 0.0
    )


async def test_events_reach_the_directory(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context
) -> None:
    engine = FakeEngine(ctx, "kv@10.0.0.1@m")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0), h(1), h(2)), stored(h(3)))
    await until(lambda: _eq(index.lookup([h(i) for i in range(5)]), {"p1": 4}))
    await engine.publish(BlockRemoved([h(2)]))
    await until(lambda: _eq(index.lookup([h(i) for i in range(5)]), {"p1": 2}))
    await engine.publish(AllBlocksCleared())
    await until(lambda: _eq(index.lookup([h(0)]), {}))
    await engine.close()


async def test_late_subscriber_replays_from_zero(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context
) -> None:
    engine = FakeEngine(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    for i in range(5):
        await engine.publish(stored(h(i)))  # nobody listens yet
    await manager.reconcile([engine.endpoint("p1")])
    await until(
        lambda: _eq(index.lookup([h(i) for i in range(5)]), {"p1": 5}), lambda: engine.publish()
    )
    await engine.close()


async def test_a_late_replay_that_stops_short_clears_the_pod(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context
) -> None:
    """The late start's replay applies the store of seq 0 and stops at the hole where the
    removal of seq 1 was: without a clear, the removed block would stay listed for good."""
    engine = FakeEngine(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await engine.publish(stored(h(0)))  # nobody listens yet
    removal = await engine.publish(BlockRemoved([h(0)]))
    engine.buffer = [(seq, data) for seq, data in engine.buffer if seq != removal]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(1)))
    await until(lambda: _eq(index.lookup([h(1)]), {"p1": 1}))
    assert await index.lookup([h(0)]) == {}
    await engine.close()


async def test_gap_is_replayed(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    replays = (
        registry.get_sample_value(
            "kvgate_directory_event_replays_total", {"pool": "ns/pool", "outcome": "ok"}
        )
        or 0
    )
    await engine.publish(stored(h(0)))
    await engine.publish(stored(h(1)), drop=True)  # lost on the wire, still in the buffer
    await engine.publish(stored(h(2)))
    await until(lambda: _eq(index.lookup([h(0), h(1), h(2)]), {"p1": 3}))
    assert (
        registry.get_sample_value(
            "kvgate_directory_event_replays_total", {"pool": "ns/pool", "outcome": "ok"}
        )
        == replays + 1
    )
    assert (
        registry.get_sample_value("kvgate_directory_event_seq_gaps_total", {"pool": "ns/pool"}) == 1
    )
    await engine.close()


async def test_gap_without_replay_clears_the_pod(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context
) -> None:
    engine = FakeEngine(ctx, "t", replay=False)
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0)), stored(h(1)))
    await until(lambda: _eq(index.lookup([h(0)]), {"p1": 1}))
    await engine.publish(BlockRemoved([h(0)]), drop=True)  # a lost removal...
    await engine.publish(stored(h(5)))
    # ...must not leave h(0) behind: the pod is cleared, later events still apply
    await until(lambda: _eq(index.lookup([h(5)]), {"p1": 1}))
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(1)]) == {}
    await engine.close()


async def test_seq_restart_means_engine_restart(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "t")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0), h(1)))
    await until(lambda: _eq(index.lookup([h(0)]), {"p1": 1}))
    generation = await index.get_generation("p1")
    engine.restart()
    await engine.publish(stored(h(0, "new")))
    await until(lambda: _eq(index.lookup([h(0, "new")]), {"p1": 1}))
    assert await index.lookup([h(0)]) == {}
    assert await index.get_generation("p1") != generation
    assert (
        registry.get_sample_value(
            "kvgate_directory_pod_clears_total", {"pool": "ns/pool", "reason": "restart"}
        )
        == 1
    )
    await engine.close()


async def test_bad_input_is_counted_and_skipped(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "kv@a@m")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(payload=b"\x93\xcb")  # truncated
    await engine.publish(payload=b"\xc1garbage")
    unknown = encode_batch(EventBatch(1.0, [stored(h(9))]))
    await engine.publish(payload=unknown.replace(b"BlockStored", b"BlockStolen"))
    await engine.pub.send_multipart([b"kv@a@m2", (99).to_bytes(8, "big"), unknown])  # other topic
    await engine.pub.send_multipart([b"kv@a@m", b"\x01"])  # not [topic, seq, payload]
    await engine.publish(stored(h(0)))
    await until(lambda: _eq(index.lookup([h(0)]), {"p1": 1}))
    assert await index.lookup([h(9)]) == {}
    for reason in ("truncated", "malformed", "unknown_type", "wrong_topic", "malformed_frame"):
        assert bad(registry, reason) == 1, reason
    await engine.close()


async def test_reconcile_adds_removes_and_clears(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    one, two = FakeEngine(ctx, "t1"), FakeEngine(ctx, "t2")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([one.endpoint("p1"), two.endpoint("p2")])
    await connected(manager, one, "p1")
    await connected(manager, two, "p2")
    await one.publish(stored(h(0)))
    await two.publish(stored(h(0)))
    await until(lambda: _eq(index.lookup([h(0)]), {"p1": 1, "p2": 1}))
    await manager.reconcile([two.endpoint("p2")])
    assert await index.lookup([h(0)]) == {"p2": 1}
    assert await index.pods() == {"p2"}
    assert set(manager.endpoints) == {"p2"}
    assert registry.get_sample_value("kvgate_directory_subscriptions", {"pool": "ns/pool"}) == 1
    await manager.reconcile([two.endpoint("p2")])  # unchanged: keeps running, keeps entries
    assert await index.lookup([h(0)]) == {"p2": 1}
    await manager.close()
    assert registry.get_sample_value("kvgate_directory_subscriptions", {"pool": "ns/pool"}) == 0
    with pytest.raises(RuntimeError):
        await manager.reconcile([])
    await one.close()
    await two.close()


async def _eq(got: Awaitable[dict[str, int]], want: dict[str, int]) -> bool:
    return await got == want


async def test_a_subscription_applies_only_its_pods_topic(
    manager: SubscriptionManager, ctx: zmq.asyncio.Context, registry: CollectorRegistry
) -> None:
    engine = FakeEngine(ctx, "kv@10.0.0.9@model")
    index: MemoryBlockIndex = manager.index  # type: ignore[attr-defined]
    await manager.reconcile([engine.endpoint("p1")])
    await connected(manager, engine, "p1")
    await engine.publish(stored(h(0)))
    # Another pod's stream on the same socket (a mis-wired endpoint): a longer topic with the
    # same prefix passes ZMQ's prefix filter, and is still dropped.
    await engine.pub.send_multipart(
        [
            b"kv@10.0.0.9@model-b",
            (1).to_bytes(8, "big"),
            encode_batch(EventBatch(1, [stored(h(1))])),
        ]
    )
    await engine.publish(stored(h(2)))
    await until(lambda: _eq(index.lookup([h(2)]), {"p1": 1}))
    assert await index.lookup([h(0), h(1)]) == {"p1": 1}
    assert bad(registry, "wrong_topic") == 1
    await engine.close()


async def test_events_into_redis_survive_a_redis_outage(
    ctx: zmq.asyncio.Context,
    redis_server_factory: Callable[[], RedisServer],
    registry: CollectorRegistry,
) -> None:
    server = redis_server_factory()
    index = RedisBlockIndex.from_url(server.url, "ns/pool", socket_timeout_seconds=1.0)
    mgr = SubscriptionManager(index, pool="ns/pool", metrics=DirectoryMetrics(registry))
    engine = FakeEngine(ctx, "t")
    try:
        await mgr.reconcile([engine.endpoint("p1")])
        await connected(mgr, engine, "p1")
        await engine.publish(stored(h(0), h(1)))
        await until(lambda: _eq(index.lookup([h(0), h(1)]), {"p1": 2}))
        server.stop()
        await engine.publish(BlockRemoved([h(1)]))  # cannot be written: Redis is down
        await until(lambda: _positive(bad(registry, "directory_error")))
        server.start()  # same port, empty (no persistence)
        await engine.publish(stored(h(2)))
        # the subscriber resumes once Redis answers, replaying from the batch that failed
        await until(lambda: _eq(index.lookup([h(2)]), {"p1": 1}), lambda: engine.publish())
        gaps = registry.get_sample_value(
            "kvgate_directory_event_seq_gaps_total", {"pool": "ns/pool"}
        )
        assert gaps is not None and gaps >= 1
    finally:
        await mgr.close()
        await index.close()
        await engine.close()


async def _positive(value: float) -> bool:
    return value > 0
