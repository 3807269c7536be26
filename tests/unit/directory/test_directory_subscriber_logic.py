"""PodSubscriber's seq and apply logic, fed messages directly (the socket path is integration)."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import AsyncIterator, Sequence

import msgpack
import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from kvgate.directory import subscriber as subscriber_module
from kvgate.directory.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    encode_batch,
)
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.subscriber import PodEndpoint, PodSubscriber
from kvgate.kvevents.decode import MAX_EVENT_BLOCKS, MAX_REJECTED_EVENTS
from kvgate.prefix import block_key
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.kv_cache import KVCacheManager
from kvgate.sim.request import SimRequest


def h(i: int) -> bytes:
    return hashlib.sha256(f"s/{i}".encode()).digest()


def msg(seq: int, *events: KVEvent, topic: bytes = b"t") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), encode_batch(EventBatch(float(seq), list(events)))]


def stored(*keys: bytes, medium: str | None = None, group: int | None = None) -> BlockStored:
    return BlockStored(list(keys), None, [0] * 16 * len(keys), 16, medium=medium, group_idx=group)


class FlakyIndex(MemoryBlockIndex):
    """A memory index whose next `fail` writes raise, like a Redis that went away."""

    fail = 0
    failing = ("add", "remove")  # which writes fail

    def _down(self, write: str) -> None:
        if self.fail and write in self.failing:
            self.fail -= 1
            raise ConnectionError("directory down")

    async def add(self, pod: str, keys: Sequence[bytes], **kwargs: object) -> bool:
        self._down("add")
        return await super().add(pod, keys, **kwargs)  # type: ignore[arg-type]

    async def remove(self, pod: str, keys: Sequence[bytes], **kwargs: object) -> bool:
        self._down("remove")
        return await super().remove(pod, keys, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def sub(registry: CollectorRegistry) -> AsyncIterator[PodSubscriber]:
    ctx = zmq.asyncio.Context()
    subscriber = PodSubscriber(
        PodEndpoint("p", "tcp://127.0.0.1:1", topic="t"),  # never connected here
        FlakyIndex(),
        ctx,
        pool="pool",
        metrics=DirectoryMetrics(registry),
        retry_seconds=0,
    )
    await subscriber._index.set_generation("p", subscriber.generation)
    yield subscriber
    ctx.destroy(linger=0)


def index_of(sub: PodSubscriber) -> FlakyIndex:
    index = sub._index
    assert isinstance(index, FlakyIndex)
    return index


def bad(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value(
            "kvgate_directory_bad_events_total", {"pool": "pool", "reason": reason}
        )
        or 0
    )


async def test_events_apply_in_order_within_and_across_batches(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    index = index_of(sub)
    await sub.handle_many([
        msg(0, stored(h(0), h(1)), BlockRemoved([h(1)]), stored(h(2))),
        msg(1, stored(h(1))),
    ])  # fmt: skip
    assert await index.lookup([h(0), h(1), h(2)]) == {"p": 3}
    await sub.handle(msg(2, stored(h(5)), AllBlocksCleared(), stored(h(6))))
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(6)]) == {"p": 1}
    events = {
        kind: registry.get_sample_value(
            "kvgate_directory_events_total", {"pool": "pool", "type": kind}
        )
        for kind in ("BlockStored", "BlockRemoved", "AllBlocksCleared")
    }
    assert events == {"BlockStored": 5, "BlockRemoved": 1, "AllBlocksCleared": 1}


async def test_queued_hashes_are_written_before_they_pass_the_bound(
    sub: PodSubscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drained messages are one write while their hashes are few; past
    `FLUSH_QUEUED_HASHES` they are written before the next message is read (a 1 GiB drain of
    one-byte int hashes queued ~56 GiB of keys). Int hashes become keys as they are written."""
    monkeypatch.setattr(subscriber_module, "FLUSH_QUEUED_HASHES", 4)
    index = index_of(sub)
    writes: list[int] = []
    add = index.add

    async def counted(pod: str, keys: Sequence[bytes], **kwargs: object) -> bool:
        writes.append(len(keys))
        return await add(pod, keys, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(index, "add", counted)
    hashes = list(range(1, 13))
    messages = [
        msg(seq, BlockStored(hashes[3 * seq : 3 * seq + 3], None, [0] * 48, 16)) for seq in range(4)
    ]
    await sub.handle_many(messages)
    assert writes == [6, 6]  # two messages each: 3 hashes queued, then 6 >= 4
    assert await index.lookup([block_key(h) for h in hashes]) == {"p": 12}


async def test_cpu_tier_media_with_an_offloading_pool(registry: CollectorRegistry) -> None:
    ctx = zmq.asyncio.Context()
    sub = PodSubscriber(
        PodEndpoint("p", "tcp://127.0.0.1:1", topic="t"), FlakyIndex(), ctx, offload_tier=True
    )
    try:
        index = index_of(sub)
        await sub.handle(msg(0, stored(h(0), medium="CPU"), stored(h(0)), BlockRemoved([h(0)])))
        assert await index.lookup([h(0)]) == {"p": 1}  # still in CPU
        assert await index.lookup([h(0)], medium="GPU") == {}
        await sub.handle(msg(1, BlockRemoved([h(0)], medium="CPU")))
        assert await index.lookup([h(0)]) == {}
        # A disk tier is priced by nothing: never indexed.
        await sub.handle(msg(2, stored(h(1), medium="STORAGE")))
        assert await index.lookup([h(1)]) == {}
    finally:
        ctx.destroy(linger=0)


async def test_media_and_groups(sub: PodSubscriber, registry: CollectorRegistry) -> None:
    index = index_of(sub)
    # The pool declares no CPU tier: its events are not GPU hits, and are skipped.
    await sub.handle(msg(0, stored(h(0), medium="CPU"), stored(h(3))))
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(3)]) == {"p": 1}
    await sub.handle(msg(1, stored(h(1), group=1), stored(h(2), group=0)))
    assert await index.lookup([h(1)]) == {}
    assert await index.lookup([h(2)]) == {"p": 1}
    assert bad(registry, "other_kv_cache_group") == 1


async def test_hybrid_models_count_only_full_attention_groups(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """A sliding-window group (here group 0) and a full-attention group (1) of one hybrid
    model: only the full-attention group's blocks say how much of a prefix the pod holds."""
    index = index_of(sub)

    def kind_stored(key: bytes, group: int, kind: str) -> BlockStored:
        return BlockStored([key], None, [0] * 16, 16, group_idx=group, kv_cache_spec_kind=kind)

    await sub.handle(
        msg(
            0,
            kind_stored(h(0), 0, "sliding_window"),
            kind_stored(h(0), 1, "full_attention"),
            kind_stored(h(1), 1, "full_attention"),
            kind_stored(h(5), 0, "sliding_window"),  # only the window's group holds it
            kind_stored(h(6), 2, "mamba"),
        )
    )
    assert await index.lookup([h(0), h(1)]) == {"p": 2}
    assert await index.lookup([h(5)]) == {} and await index.lookup([h(6)]) == {}
    # The window slid past block 0: that group drops it, the full-attention group still holds it.
    await sub.handle(msg(1, BlockRemoved([h(0)], group_idx=0)))
    assert await index.lookup([h(0), h(1)]) == {"p": 2}
    # A removal carries no kind: the group's kind was learned from its stores.
    await sub.handle(msg(2, BlockRemoved([h(1)], group_idx=1)))
    assert await index.lookup([h(0), h(1)]) == {"p": 1}
    assert bad(registry, "other_kv_cache_group") == 0  # expected, not bad input


async def test_seq_handling_without_replay(sub: PodSubscriber, registry: CollectorRegistry) -> None:
    index = index_of(sub)
    await sub.handle(msg(5, stored(h(0))))  # first message: nothing to replay from, applied
    await sub.handle(msg(6, stored(h(1))))
    assert sub.expected == 7
    assert await index.lookup([h(0), h(1)]) == {"p": 2}
    await sub.handle(msg(8, stored(h(3))))  # gap, no replay socket: the pod is cleared
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(3)]) == {"p": 1}
    first_generation = sub.generation
    await sub.handle(msg(0, stored(h(7))))  # back to 0: the engine restarted
    assert sub.generation != first_generation
    assert await index.get_generation("p") == sub.generation
    assert await index.lookup([h(3)]) == {}
    assert await index.lookup([h(7)]) == {"p": 1}
    clears = {
        r: registry.get_sample_value(
            "kvgate_directory_pod_clears_total", {"pool": "pool", "reason": r}
        )
        for r in ("gap", "restart")
    }
    assert clears == {"gap": 1, "restart": 1}


def sent(seq: int, *events: object) -> list[bytes]:
    """A message of events as a pod could send them, valid or not (array encoding)."""
    return [b"t", seq.to_bytes(8, "big"), msgpack.packb([float(seq), list(events), None])]


async def test_a_removal_that_is_rejected_clears_the_pod(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """A removal the decoder rejects (too many hashes, a bad hash) cannot be applied; skipping
    it left the blocks it named listed for good, so the pod is cleared after its batch."""
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0), h(1))))
    too_many = ["BlockRemoved", [h(0)] * (MAX_EVENT_BLOCKS + 1)]
    await sub.handle(sent(1, too_many, ["BlockStored", [h(2)], None, [0] * 16, 16]))
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(2)]) == {}  # stored before the clear, so cleared too
    await sub.handle(msg(2, stored(h(3))))
    assert await index.lookup([h(3)]) == {"p": 1}  # the pod is followed on
    await sub.handle(sent(3, ["BlockRemoved", [b"short"]]))
    assert await index.lookup([h(3)]) == {}
    # A rejected store only under-reports: nothing is cleared for it.
    await sub.handle(msg(4, stored(h(4))))
    await sub.handle(sent(5, ["BlockStored", [b"short"], None, [0] * 16, 16]))
    assert await index.lookup([h(4)]) == {"p": 1}
    # Past the 64th rejection the rest is not read: a removal may be among it.
    await sub.handle(sent(6, *[["Unknown"]] * (MAX_REJECTED_EVENTS + 1)))
    assert await index.lookup([h(4)]) == {}
    clears = registry.get_sample_value(
        "kvgate_directory_pod_clears_total", {"pool": "pool", "reason": "lost_removal"}
    )
    assert clears == 3
    assert bad(registry, "too_many_blocks") == 1


async def test_events_of_blocks_of_another_size_than_the_pools_are_counted_and_skipped(
    registry: CollectorRegistry,
) -> None:
    """Their hashes chain other blocks than the router's keys (a pool configured with another
    block size than its engines'): indexed, they filled the directory with entries no lookup
    could match, and nothing said so."""
    ctx = zmq.asyncio.Context()
    index = MemoryBlockIndex()
    sub = PodSubscriber(PodEndpoint("p", "tcp://127.0.0.1:1", topic="t"), index, ctx,
                        pool="pool", metrics=DirectoryMetrics(registry), block_size=32)  # fmt: skip
    await index.set_generation("p", sub.generation)
    try:
        await sub.handle(msg(0, stored(h(0), h(1))))  # 16-token blocks
        assert await index.lookup([h(0)]) == {}
        assert bad(registry, "block_size_mismatch") == 1
        matching = BlockStored([h(2)], None, [0] * 32, 32)
        await sub.handle(msg(1, matching))
        assert await index.lookup([h(2)]) == {"p": 1}
    finally:
        ctx.destroy(linger=0)


async def test_a_newer_writer_wins(sub: PodSubscriber, registry: CollectorRegistry) -> None:
    index = index_of(sub)
    await index.set_generation("p", "someone-else")
    await sub.handle(msg(0, stored(h(0))))
    assert await index.lookup([h(0)]) == {}
    assert bad(registry, "stale_generation") == 1


async def test_a_superseded_subscription_clears_nothing(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """Two indexers follow the pod during a rolling update: the newer one's generation owns
    its entries, and the older one's clears (a batch's AllBlocksCleared, a gap it alone saw)
    wiped them, as its adds could not."""
    index = index_of(sub)
    await index.set_generation("p", "next-indexer")
    await index.add("p", [h(0)], generation="next-indexer")
    await sub.handle(msg(0, AllBlocksCleared()))
    await sub.handle(msg(50_000, stored(h(1))))  # a jump past the replay buffer: a clear
    assert await index.lookup([h(0)]) == {"p": 1}
    assert bad(registry, "stale_generation") == 3  # two clears and the store


async def test_directory_failure_rewinds_expected_seq(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0))))
    index.fail = 1
    await sub.handle_many([msg(1, BlockRemoved([h(0)])), msg(2, stored(h(2)))])
    assert sub.expected == 1  # the next message will look like a gap from 1 and replay it
    assert bad(registry, "directory_error") == 1


async def test_a_failed_store_restarts_the_pod_rather_than_replaying_it(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """A store that timed out may have landed: replayed, it would count a second copy."""
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0))))
    before = sub.generation
    index.fail = 1
    await sub.handle(msg(1, stored(h(1))))
    assert sub.generation != before and sub.expected is None
    assert bad(registry, "directory_error") == 1


async def test_a_failure_after_some_writes_landed_restarts_the_pod(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """Replaying the drained messages would store the landed writes' blocks a second time."""
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0)), stored(h(1))))
    before = sub.generation
    index.fail, index.failing = 1, ("add",)
    await sub.handle(msg(1, BlockRemoved([h(1)]), stored(h(2))))  # the removal lands, not the store
    assert sub.generation != before and sub.expected is None
    assert await index.lookup([h(0)]) == {}
    assert bad(registry, "directory_error") == 1
    clears = {"pool": "pool", "reason": "error"}
    assert registry.get_sample_value("kvgate_directory_pod_clears_total", clears) == 1
    await sub.handle(msg(2, stored(h(0))))  # followed again (what the replay buffer holds)
    assert await index.lookup([h(0)]) == {"p": 1}


async def test_the_directory_agrees_with_an_engine_that_caches_copies(sub: PodSubscriber) -> None:
    """vLLM's block pool (and the simulator's) may cache one hash in several blocks: requests
    scheduled together each compute and store the prefix none of them found cached, and every
    evicted copy is removed on its own. The directory holds a block as long as the engine does."""
    index, block_size = index_of(sub), 4
    kv = KVCacheManager(num_gpu_blocks=24, block_size=block_size)
    hasher = PrefixBlockHasher("sha256", block_size, None)
    rng = random.Random(5)
    prompts = [[p % 3] * 8 + [p] * rng.randrange(4, 13) + [99] for p in range(8)]
    seen: set[bytes] = set()
    copies = seq = 0
    for step in range(300):
        batch = []
        for n in range(rng.randrange(1, 4)):
            request = SimRequest(f"{step}.{n}", rng.choice(prompts), max_tokens=1, arrival_time=0)
            request.update_block_hashes(hasher, block_size)
            batch.append(request)
        hits = [kv.get_computed_blocks(r) for r in batch]  # one step: none sees the others
        for request, hit in zip(batch, hits, strict=True):
            if kv.allocate_slots(request, request.num_tokens - len(hit) * block_size, hit):
                request.num_computed_tokens = request.num_tokens
        copies += sum(len(ids) - 1 for ids in kv._cached.values())
        for request in batch:
            kv.free(request)
            seen.update(request.block_hashes)
        if events := kv.take_events():
            await sub.handle(msg(seq, *events))
            seq += 1
        for block in seen:
            assert bool(await index.lookup([block])) == kv.is_cached(block), step
    assert copies > 100  # the engine did cache copies


async def test_wrong_topic_and_frames(sub: PodSubscriber, registry: CollectorRegistry) -> None:
    await sub.handle(msg(0, stored(h(0)), topic=b"t2"))
    await sub.handle([b"t", b"\x00" * 7, b""])
    await sub.handle([b"t"])
    assert sub.expected is None
    assert (bad(registry, "wrong_topic"), bad(registry, "malformed_frame")) == (1, 2)


async def test_vllms_default_empty_topic_is_the_pods_own(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """An engine started without a topic (vLLM's default "") publishes on its own socket: a
    subscription that expects the operator's topic still applies those messages."""
    await sub.handle(msg(0, stored(h(0)), topic=b""))
    assert await index_of(sub).lookup([h(0)]) == {"p": 1}
    assert bad(registry, "wrong_topic") == 0


def raw_msg(seq_bytes: bytes, *events: KVEvent, topic: bytes = b"t") -> list[bytes]:
    return [topic, seq_bytes, encode_batch(EventBatch(1.0, list(events)))]


async def test_seqs_no_vllm_counter_reaches_are_skipped(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0))))
    for seq in ((1 << 64) - 1, 1 << 63, (1 << 63) + 5):  # -1 (the replay end marker), ...
        await sub.handle(raw_msg(seq.to_bytes(8, "big"), stored(h(9))))
    assert bad(registry, "bad_seq") == 3
    assert bad(registry, "directory_error") == 0
    assert sub.expected == 1  # nothing changed
    await sub.handle(msg(1, stored(h(1))))
    assert await index.lookup([h(0), h(1), h(9)]) == {"p": 2}


async def test_a_jump_past_the_replay_buffer_clears_and_follows_the_new_seq(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    index = index_of(sub)
    await sub.handle(msg(0, stored(h(0))))
    absurd = 1 << 62
    await sub.handle(msg(absurd, stored(h(1))))  # no replay attempted: nothing could hold it
    assert sub.expected == absurd + 1
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(1)]) == {"p": 1}
    assert bad(registry, "seq_jump") == 1 and bad(registry, "directory_error") == 0
    replays = registry.get_sample_value(
        "kvgate_directory_event_replays_total", {"pool": "pool", "outcome": "failed"}
    )
    assert replays is None
    assert (
        registry.get_sample_value(
            "kvgate_directory_pod_clears_total", {"pool": "pool", "reason": "gap"}
        )
        == 1
    )
    # The real engine's next seq is far below: it reads as a restart, which heals the pod.
    await sub.handle(msg(7, stored(h(2))))
    assert sub.expected == 8
    assert await index.lookup([h(1)]) == {}
    assert await index.lookup([h(2)]) == {"p": 1}


async def test_the_replay_buffer_bound_is_configurable(registry: CollectorRegistry) -> None:
    from kvgate.api.router_config import KvEventsConfig

    ctx = zmq.asyncio.Context()
    index = MemoryBlockIndex()
    small = PodSubscriber(
        PodEndpoint("p", "tcp://127.0.0.1:1", topic="t"),
        index,
        ctx,
        pool="pool",
        metrics=DirectoryMetrics(registry),
        limits=KvEventsConfig(replay_buffer_steps=3),
    )
    await small.handle(msg(0, stored(h(0))))
    await small.handle(msg(4, stored(h(1))))  # 3 missing: within the buffer (no socket: clear)
    assert bad(registry, "seq_jump") == 0
    await small.handle(msg(9, stored(h(2))))  # 4 missing: beyond it
    assert bad(registry, "seq_jump") == 1
    ctx.destroy(linger=0)


async def test_a_first_message_with_an_absurd_seq_costs_nothing(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    index = index_of(sub)
    await sub.handle(msg((1 << 63) - 1, stored(h(0))))
    assert sub.expected == 1 << 63
    assert await index.lookup([h(0)]) == {"p": 1}


async def test_an_empty_topic_is_a_topic_too(registry: CollectorRegistry) -> None:
    ctx = zmq.asyncio.Context()
    index = MemoryBlockIndex()
    sub = PodSubscriber(
        PodEndpoint("p", "tcp://127.0.0.1:1", topic=""),
        index,
        ctx,
        pool="pool",
        metrics=DirectoryMetrics(registry),
    )
    await sub.handle(msg(0, stored(h(0)), topic=b"kv@10.0.0.2@m"))  # another pod's stream
    await sub.handle(msg(0, stored(h(1)), topic=b""))
    assert await index.lookup([h(0)]) == {}
    assert await index.lookup([h(1)]) == {"p": 1}
    assert bad(registry, "wrong_topic") == 1
    ctx.destroy(linger=0)


async def test_a_batch_timestamp_that_is_no_time_is_not_observed_as_lag(
    sub: PodSubscriber, registry: CollectorRegistry
) -> None:
    """-inf would make the lag +Inf, NaN would make it NaN: either leaves the histogram's sum
    useless for the pool for good. The batches still apply."""
    for seq, ts in enumerate((float("-inf"), float("nan"), float("inf"), -1e308, -1e308)):
        await sub.handle(
            [b"t", seq.to_bytes(8, "big"), encode_batch(EventBatch(ts, [stored(h(seq))]))]
        )
    assert await index_of(sub).lookup([h(0), h(1), h(2), h(3), h(4)]) == {"p": 5}
    labels = {"pool": "pool"}
    assert not registry.get_sample_value("kvgate_directory_event_lag_seconds_count", labels)
    await sub.handle(msg(5, stored(h(5))))  # a real one still counts
    assert registry.get_sample_value("kvgate_directory_event_lag_seconds_count", labels) == 1
    lag_sum = registry.get_sample_value("kvgate_directory_event_lag_seconds_sum", labels)
    assert lag_sum is not None and math.isfinite(lag_sum)


async def test_a_reload_of_the_pools_block_size_reaches_its_subscriptions(
    registry: CollectorRegistry,
) -> None:
    """The block size was read when the pool's first pod appeared: after a reload to other
    engines, every BlockStored of the new pods was skipped as a mismatch."""
    from kvgate.api.router_config import EngineConfig
    from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
    from kvgate.indexer.subscriptions import EventIndexer

    endpoints = EndpointSet()
    index = MemoryBlockIndex()
    engine = {"pool": EngineConfig(block_size=16)}
    indexer = EventIndexer(endpoints, {"pool": index}, engine_of=engine.get)
    spec = EndpointSpec("p", "pool", "http://127.0.0.1:1", kv_events="tcp://127.0.0.1:1")
    await endpoints.replace_pool("pool", [spec])
    await indexer.sync_pool("pool")
    try:
        engine["pool"] = EngineConfig(block_size=32)
        await indexer.sync_pool("pool")  # what a reload does
        sub = indexer._managers["pool"].subscriber("p")
        assert sub is not None
        await index.set_generation("p", sub.generation)
        await sub.handle([b"", (0).to_bytes(8, "big"),
                          encode_batch(EventBatch(0.0, [BlockStored([h(0)], None, [0] * 32, 32)]))])  # fmt: skip
        assert await index.lookup([h(0)]) == {"p": 1}
    finally:
        await indexer.close()
