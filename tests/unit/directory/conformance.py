"""The BlockIndex conformance suite: every backend must pass it unchanged.

A backend's test module subclasses `BlockIndexConformance` and provides two fixtures:
`clock` (a `FakeClock` that the backend reads for approximate-entry expiry) and `index`
(a fresh, empty index with `CAP` exact and `APPROX_CAP` approximate entries per pod, reading
`clock`). The memory run is in tests/unit/directory, the Redis run (against a real
redis-server) in tests/integration/directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from kvgate.directory.base import MAX_COPIES, BlockIndex, IndexStats

CAP = 64
APPROX_CAP = 8


class FakeClock:
    """A wall clock that only moves when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def chain(n: int, tag: str = "c", size: int = 32) -> list[bytes]:
    """n distinct block keys (digests of `tag`/i, truncated to `size` bytes)."""
    return [hashlib.sha256(f"{tag}/{i}".encode()).digest()[:size] for i in range(n)]


async def check_only_the_owners_writes_show_it_alive(
    index: BlockIndex, pass_time: Callable[[float], Awaitable[None]]
) -> None:
    """`owner_silent` by each kind of write: the owner's applied `add`, `remove` and
    `set_generation` show it alive; a refused write (another generation's) does not.
    `pass_time(s)`: let `s` seconds pass on the index's clock (Redis: its own)."""
    silence = 0.2
    await index.set_generation("a", "g1")
    assert not await index.owner_silent("a", "g2", silence)
    await pass_time(2 * silence)
    assert await index.owner_silent("a", "g2", silence)
    assert await index.remove("a", chain(1), generation="g1")
    assert not await index.owner_silent("a", "g2", silence)
    await pass_time(2 * silence)
    assert not await index.add("a", chain(1), generation="g2")  # refused: g1 said nothing
    assert await index.owner_silent("a", "g2", silence)
    assert await index.add("a", chain(1), generation="g1")
    assert not await index.owner_silent("a", "g2", silence)


class BlockIndexConformance:
    # -- lookup ------------------------------------------------------------------------------

    async def test_empty_index_and_empty_chain(self, index: BlockIndex) -> None:
        assert await index.lookup(chain(4)) == {}
        await index.add("a", chain(4))
        assert await index.lookup([]) == {}
        assert await index.pods() == {"a"}

    async def test_leading_blocks_per_pod(self, index: BlockIndex) -> None:
        keys = chain(10)
        await index.add("a", keys[:10])
        await index.add("b", keys[:3])
        await index.add("c", chain(5, "other"))
        assert await index.lookup(keys) == {"a": 10, "b": 3}
        assert await index.lookup(keys[:2]) == {"a": 2, "b": 2}

    async def test_a_hole_ends_the_match(self, index: BlockIndex) -> None:
        keys = chain(6)
        await index.add("a", [keys[0], keys[1], keys[3], keys[4], keys[5]])
        assert await index.lookup(keys) == {"a": 2}

    async def test_blocks_after_one_nobody_holds_do_not_count(self, index: BlockIndex) -> None:
        keys = chain(6)
        await index.add("a", keys[:2])
        await index.add("b", [keys[0], *keys[2:]])  # skips keys[1]
        assert await index.lookup(keys) == {"a": 2, "b": 1}
        await index.add("c", keys[3:])  # never holds block 0
        assert await index.lookup(keys) == {"a": 2, "b": 1}

    async def test_pods_filter(self, index: BlockIndex) -> None:
        keys = chain(4)
        await index.add("a", keys)
        await index.add("b", keys[:2])
        assert await index.lookup(keys, pods={"b"}) == {"b": 2}
        assert await index.lookup(keys, pods=["b", "nope"]) == {"b": 2}
        assert await index.lookup(keys, pods=[]) == {}

    async def test_long_chain_full_match(self, index: BlockIndex) -> None:
        keys = chain(2048, "long")
        await index.add("a", keys[:CAP])
        await index.add("b", keys[: CAP // 2])
        assert await index.lookup(keys) == {"a": CAP, "b": CAP // 2}

    async def test_any_key_bytes_and_pod_names(self, index: BlockIndex) -> None:
        keys = [b"\x00" * 8, b"{x}:y", bytes(range(256))[:32], b"\xff" * 32]
        pod = "ns/pod:{1}@kv é"
        await index.add(pod, keys)
        assert await index.lookup(keys) == {pod: 4}
        assert await index.lookup([b"\x00" * 7]) == {}

    async def test_many_pods(self, index: BlockIndex) -> None:
        keys = chain(10)
        for pod in range(70):  # more than one 32- or 64-bit word of pods
            await index.add(f"p{pod}", keys[: 1 + pod % 10])
        expected = {f"p{pod}": 1 + pod % 10 for pod in range(70)}
        assert await index.lookup(keys) == expected
        assert await index.lookup(keys, pods=["p9", "p68"]) == {"p9": 10, "p68": 9}
        await index.remove("p69", keys[:1])
        del expected["p69"]
        assert await index.lookup(keys) == expected

    async def test_random_operations_match_a_model(self, index: BlockIndex) -> None:
        rng = random.Random(7)
        chains = [chain(30, f"r{c}") for c in range(2)]  # at most 60 keys per pod: under CAP
        pods = [f"p{i}" for i in range(40)]
        model: dict[str, Counter[bytes]] = {}  # pod -> copies of each key
        for _step in range(300):
            pod, keys = rng.choice(pods), rng.choice(chains)
            lo = rng.randrange(30)
            part = (
                keys[lo : lo + rng.randrange(1, 20)]
                if rng.random() < 0.3
                else keys[: rng.randrange(1, 30)]
            )
            action = rng.random()
            if action < 0.6:
                await index.add(pod, part)
                model.setdefault(pod, Counter()).update(part)
            elif action < 0.9:
                await index.remove(pod, part)
                model.get(pod, Counter()).subtract(part)
                model[pod] = +model.get(pod, Counter())  # never below zero copies
            else:
                await index.clear_pod(pod)
                model.get(pod, Counter()).clear()
            if _step % 10 == 0:
                keys = rng.choice(chains)
                wanted = None if rng.random() < 0.5 else set(rng.sample(pods, 5))
                expected = {}
                for p, held in model.items():
                    n = 0
                    while n < len(keys) and keys[n] in held:
                        n += 1
                    if n and (wanted is None or p in wanted):
                        expected[p] = n
                assert await index.lookup(keys, wanted) == expected

    # -- add / remove ------------------------------------------------------------------------

    async def test_add_is_order_free_and_copies_are_no_entries(self, index: BlockIndex) -> None:
        keys = chain(5)
        assert await index.add("a", list(reversed(keys)))
        await index.add("a", [keys[2], keys[2], keys[0]])
        assert await index.lookup(keys) == {"a": 5}
        assert (await index.stats()).entries == 5

    async def test_remove(self, index: BlockIndex) -> None:
        keys = chain(5)
        await index.add("a", keys)
        await index.add("b", keys)
        assert await index.remove("a", [keys[2]])
        assert await index.lookup(keys) == {"a": 2, "b": 5}
        await index.remove("a", [keys[2], chain(1, "absent")[0]])  # absent: no-op
        await index.remove("ghost", keys)  # unknown pod: no-op
        assert await index.pods() == {"a", "b"}
        assert await index.lookup(keys) == {"a": 2, "b": 5}

    async def test_media_are_tracked_separately(self, index: BlockIndex) -> None:
        keys = chain(3)
        await index.add("a", keys)
        await index.add("a", keys[:2], medium="CPU")
        await index.remove("a", keys)  # GPU copies gone, CPU copies of the first two remain
        assert await index.lookup(keys) == {"a": 2}
        assert (await index.stats()).entries == 2
        await index.remove("a", keys[:1], medium="CPU")
        assert await index.lookup(keys) == {}

    async def test_lookup_in_one_medium(self, index: BlockIndex, clock: FakeClock) -> None:
        """A GPU tier holding the first blocks and a CPU tier holding more of the chain."""
        keys = chain(60)
        await index.add("a", keys[:20])
        await index.add("a", keys[5:50], medium="CPU")
        await index.add("b", keys[:30], medium="CPU")
        await index.add_approximate("c", keys[:APPROX_CAP], ttl_seconds=10)
        assert await index.lookup(keys) == {"a": 50, "b": 30, "c": APPROX_CAP}
        assert await index.lookup(keys, medium="GPU") == {"a": 20, "c": APPROX_CAP}
        assert await index.lookup(keys, medium="CPU") == {"b": 30}
        assert await index.lookup(keys, ["a", "ghost"], medium="GPU") == {"a": 20}
        assert await index.lookup(keys[5:], ["a"], medium="CPU") == {"a": 45}
        assert await index.lookup(keys, medium="NVME") == {}
        clock.advance(11)  # routing history expired
        assert await index.lookup(keys, medium="GPU") == {"a": 20}
        await index.remove("a", keys[:3])  # a GPU hole at block 0 ends the GPU match
        assert await index.lookup(keys, ["a"], medium="GPU") == {}
        assert await index.lookup(keys, ["a"]) == {}  # block 0 is held nowhere now
        assert await index.lookup(keys[3:], ["a"]) == {"a": 47}

    async def test_bad_medium_and_pod_are_rejected(self, index: BlockIndex) -> None:
        with pytest.raises(ValueError):
            await index.add("a", chain(1), medium="")
        with pytest.raises(ValueError):
            await index.add("a", chain(1), medium="GPU,CPU")
        with pytest.raises(ValueError):
            await index.add("a", chain(1), medium="GPU*2")  # the Redis backend's copy marker
        with pytest.raises(ValueError):
            await index.add("", chain(1))
        assert await index.pods() == set()

    async def test_cap_bounds_exact_entries_per_pod(self, index: BlockIndex) -> None:
        await index.add("a", chain(CAP + 10, "x"))
        await index.add("a", chain(20, "y"))
        await index.add("b", chain(3, "y"))
        stats = await index.stats()
        assert stats.entries == CAP + 3
        got = await index.lookup(chain(CAP + 10, "x"))
        assert got.get("a", 0) <= CAP

    # -- copies (vLLM may cache one hash in several blocks: one store, one removal each) -------

    async def test_a_second_copy_outlives_one_removal(self, index: BlockIndex) -> None:
        keys = chain(3)
        await index.add("a", keys)
        await index.add("a", keys[1:2])  # a second block with the hash of block 1
        await index.add("b", keys)
        assert await index.remove("a", keys[1:2])
        assert await index.lookup(keys) == {"a": 3, "b": 3}
        assert (await index.stats()).entries == 6
        await index.remove("a", keys[1:2])
        assert await index.lookup(keys) == {"a": 1, "b": 3}
        await index.remove("b", keys[1:2])  # another pod's copies are its own
        assert await index.lookup(keys) == {"a": 1, "b": 1}

    async def test_removing_more_than_stored_stops_at_zero(self, index: BlockIndex) -> None:
        keys = chain(2)
        await index.add("a", keys)
        await index.add("a", keys[:1])
        for _ in range(3):
            await index.remove("a", keys)
        assert await index.lookup(keys) == {}
        assert (await index.stats()).entries == 0
        await index.add("a", keys)  # no debt: one store is held again, one removal drops it
        assert await index.lookup(keys) == {"a": 2}
        await index.remove("a", keys)
        assert await index.lookup(keys) == {}

    async def test_repeated_keys_in_one_call_are_copies(self, index: BlockIndex) -> None:
        keys = chain(2)
        k = keys[0]
        await index.add("a", [k, keys[1], k, k])  # three stores of block 0 in one batch
        await index.remove("a", [k, k])  # two removals in one batch
        assert await index.lookup(keys) == {"a": 2}
        await index.remove("a", [k])
        assert await index.lookup(keys) == {}
        await index.add("a", [k, k])  # held once already in no medium: both count
        await index.add("a", [k])
        await index.remove("a", [k, k])
        assert await index.lookup(keys[:1]) == {"a": 1}
        await index.remove("a", [k])
        assert await index.lookup(keys[:1]) == {}

    async def test_copies_are_counted_per_medium(self, index: BlockIndex) -> None:
        keys = chain(2)
        await index.add("a", keys)
        await index.add("a", keys[:1])  # block 0: two GPU copies
        await index.add("a", keys[:1], medium="CPU")  # and one in the CPU tier
        await index.add("a", keys[1:], medium="CPU")
        await index.add("a", keys[1:], medium="CPU")  # block 1: one GPU copy, two CPU copies
        assert await index.lookup(keys, medium="GPU") == {"a": 2}
        assert await index.lookup(keys, medium="CPU") == {"a": 2}
        await index.remove("a", keys, medium="CPU")  # block 0 leaves the CPU tier
        assert await index.lookup(keys, medium="CPU") == {}
        assert await index.lookup(keys[1:], medium="CPU") == {"a": 1}
        await index.remove("a", keys[:1], medium="CPU")  # no CPU copy left: GPU copies stay
        await index.remove("a", keys[:1])
        assert await index.lookup(keys, medium="GPU") == {"a": 2}
        await index.remove("a", keys)  # the last GPU copies
        assert await index.lookup(keys, medium="GPU") == {}
        assert await index.lookup(keys) == {}  # block 0 is gone everywhere
        assert await index.lookup(keys[1:]) == {"a": 1}  # block 1 has a CPU copy
        await index.remove("a", keys[1:], medium="CPU")
        assert (await index.stats()).entries == 0

    async def test_approximate_entries_have_no_copies(
        self, index: BlockIndex, clock: FakeClock
    ) -> None:
        keys = chain(3)
        await index.add_approximate("a", keys, ttl_seconds=60)
        await index.add_approximate("a", keys, ttl_seconds=60)
        await index.remove("a", keys[2:])
        assert await index.lookup(keys) == {"a": 2}
        await index.add("a", keys[:1])  # the approximate entry becomes one exact copy
        await index.add_approximate("a", keys[:1], ttl_seconds=60)  # no second copy
        await index.remove("a", keys[:1])
        assert await index.lookup(keys) == {}
        await index.add("a", keys[1:2])
        await index.add("a", keys[1:2])  # two exact copies; routing history changes nothing
        await index.add_approximate("a", keys[1:2], ttl_seconds=1)
        clock.advance(10)
        await index.remove("a", keys[1:2])
        assert await index.lookup(keys[1:]) == {"a": 1}
        stats = await index.stats()
        assert (stats.entries, stats.approximate_entries) == (1, 0)
        await index.remove("a", keys[1:2])
        assert await index.lookup(keys[1:]) == {}

    async def test_clear_and_new_generation_drop_every_copy(self, index: BlockIndex) -> None:
        keys = chain(2)
        await index.add("a", [*keys, *keys, *keys], generation="g1")
        await index.clear_pod("a")
        await index.add("a", keys, generation="g1")
        await index.remove("a", keys, generation="g1")
        assert await index.lookup(keys) == {}
        await index.add("a", [*keys, *keys], generation="g1")
        await index.set_generation("a", "g2")
        await index.add("a", keys, generation="g2")
        await index.remove("a", keys, generation="g2")
        assert await index.lookup(keys) == {}
        await index.add("a", [*keys, *keys], generation="g2")
        await index.forget_pod("a")
        await index.add("a", keys)
        await index.remove("a", keys)
        assert await index.lookup(keys) == {}

    async def test_copies_are_bounded(self, index: BlockIndex) -> None:
        keys = chain(1)
        await index.add("a", keys * (MAX_COPIES + 100))  # a stream repeating one store
        await index.add("a", keys)
        for _ in range(MAX_COPIES - 1):
            await index.remove("a", keys)
        assert await index.lookup(keys) == {"a": 1}
        await index.remove("a", keys)  # stores beyond MAX_COPIES were not counted
        assert await index.lookup(keys) == {}

    async def test_cap_eviction_drops_every_copy(self, index: BlockIndex) -> None:
        old = chain(CAP, "old")
        await index.add("a", old)
        await index.add("a", old)  # two copies of each
        await index.add("a", chain(CAP // 2, "new"))  # evicts CAP // 2 entries
        assert (await index.stats()).entries == CAP
        evicted = 0
        for key in old:
            if await index.lookup([key]):
                await index.remove("a", [key])
                assert await index.lookup([key]) == {"a": 1}
                await index.remove("a", [key])
            else:  # its copies went with it: a new store is one copy
                evicted += 1
                await index.add("a", [key])
                await index.remove("a", [key])
            assert await index.lookup([key]) == {}
        assert evicted > 0

    # -- clear, forget, generations ----------------------------------------------------------

    async def test_clear_pod_keeps_generation(self, index: BlockIndex) -> None:
        keys = chain(4)
        await index.add("a", keys, generation="g1")
        await index.add("b", keys)
        await index.add_approximate("a", chain(2, "ap"), ttl_seconds=60)
        await index.clear_pod("a")
        assert await index.lookup(keys) == {"b": 4}
        assert await index.lookup(chain(2, "ap")) == {}
        assert await index.get_generation("a") == "g1"
        assert await index.pods() == {"a", "b"}
        assert await index.add("a", keys[:1], generation="g1")
        assert await index.lookup(keys) == {"a": 1, "b": 4}
        await index.clear_pod("ghost")
        assert await index.pods() == {"a", "b"}

    async def test_forget_pod(self, index: BlockIndex) -> None:
        keys = chain(4)
        await index.add("a", keys, generation="g1")
        await index.forget_pod("a")
        assert await index.pods() == set()
        assert await index.get_generation("a") is None
        assert await index.lookup(keys) == {}
        assert await index.stats() == IndexStats(pods=0, entries=0, approximate_entries=0)

    async def test_new_generation_drops_old_entries(self, index: BlockIndex) -> None:
        keys = chain(4)
        assert await index.set_generation("a", "g1")
        await index.add("a", keys, generation="g1")
        assert not await index.set_generation("a", "g1")
        assert await index.lookup(keys) == {"a": 4}
        assert await index.set_generation("a", "g2")
        assert await index.lookup(keys) == {}
        assert (await index.stats()).entries == 0
        assert await index.get_generation("a") == "g2"

    async def test_stale_writers_are_ignored(self, index: BlockIndex) -> None:
        keys = chain(4)
        await index.set_generation("a", "g2")
        assert not await index.add("a", keys, generation="g1")
        assert await index.lookup(keys) == {}
        assert await index.add("a", keys, generation="g2")
        assert not await index.remove("a", keys, generation="g1")
        assert await index.lookup(keys) == {"a": 4}
        assert await index.add("a", keys[:1])  # no generation: writes into the current one
        assert await index.remove("a", keys[3:], generation="g2")
        assert await index.lookup(keys) == {"a": 3}

    async def test_first_generation_is_adopted(self, index: BlockIndex) -> None:
        keys = chain(3)
        assert await index.add("a", keys)  # no generation yet
        assert await index.get_generation("a") is None
        assert await index.add("a", keys[:1], generation="g1")
        assert await index.get_generation("a") == "g1"
        assert await index.lookup(keys) == {"a": 3}
        await index.add("b", keys)
        assert await index.set_generation("b", "gb")  # adopted: entries kept
        assert await index.lookup(keys) == {"a": 3, "b": 3}
        with pytest.raises(ValueError):
            await index.set_generation("b", "")

    async def test_a_generation_that_stopped_writing_is_silent(self, index: BlockIndex) -> None:
        keys = chain(2)
        assert not await index.owner_silent("a", "g2", 0)  # unknown
        await index.add("a", keys)  # no generation: nobody's
        assert not await index.owner_silent("a", "g2", 0)
        await index.set_generation("a", "g1")
        assert not await index.owner_silent("a", "g1", 0)  # its own
        assert await index.owner_silent("a", "g2", 0)  # no write of g1 for 0 s
        await index.add("a", keys, generation="g1")
        assert not await index.owner_silent("a", "g2", 3600)  # g1 wrote just now
        await index.forget_pod("a")
        assert not await index.owner_silent("a", "g2", 0)

    async def test_a_clear_with_a_generation_clears_only_that_generations_entries(
        self, index: BlockIndex
    ) -> None:
        keys = chain(4)
        await index.set_generation("a", "g2")
        await index.add("a", keys, generation="g2")
        await index.clear_pod("a", generation="g1")  # superseded: clears nothing
        assert await index.lookup(keys) == {"a": 4}
        await index.clear_pod("a", generation="g2")
        assert await index.lookup(keys) == {}
        await index.add("b", keys)  # no generation: any clear clears it
        await index.clear_pod("b", generation="g1")
        assert await index.lookup(keys) == {}

    # -- approximate entries -----------------------------------------------------------------

    async def test_approximate_entries_expire(self, index: BlockIndex, clock: FakeClock) -> None:
        keys = chain(4)
        await index.add_approximate("a", keys, ttl_seconds=10)
        assert await index.pods() == {"a"}
        assert await index.lookup(keys) == {"a": 4}
        clock.advance(5)
        await index.add_approximate("a", keys[:2], ttl_seconds=10)  # refresh the first two
        clock.advance(6)
        assert await index.lookup(keys) == {"a": 2}
        clock.advance(5)
        assert await index.lookup(keys) == {}

    async def test_exact_beats_approximate(self, index: BlockIndex, clock: FakeClock) -> None:
        keys = chain(4)
        await index.add_approximate("a", keys[:2], ttl_seconds=1)
        await index.add("a", keys[:2])
        await index.add("a", keys[2:])
        await index.add_approximate("a", keys, ttl_seconds=1)
        clock.advance(10)
        assert await index.lookup(keys) == {"a": 4}
        stats = await index.stats()
        assert (stats.entries, stats.approximate_entries) == (4, 0)
        await index.remove("a", keys[3:])
        assert await index.lookup(keys) == {"a": 3}

    async def test_remove_drops_approximate(self, index: BlockIndex, clock: FakeClock) -> None:
        keys = chain(3)
        await index.add_approximate("a", keys, ttl_seconds=100)
        await index.remove("a", keys[1:2])
        assert await index.lookup(keys) == {"a": 1}

    async def test_approximate_and_exact_mix_in_one_chain(self, index: BlockIndex) -> None:
        keys = chain(4)
        await index.add("a", keys[:2])
        await index.add_approximate("a", keys[2:], ttl_seconds=30)
        assert await index.lookup(keys) == {"a": 4}

    async def test_approximate_cap_evicts_soonest_expiring(self, index: BlockIndex) -> None:
        keys = chain(APPROX_CAP + 1, "ap")
        await index.add_approximate("a", keys[:1], ttl_seconds=5)
        await index.add_approximate("a", keys[1:], ttl_seconds=50)
        stats = await index.stats()
        assert stats.approximate_entries == APPROX_CAP
        assert await index.lookup(keys) == {}  # block 0 was the one to go
        assert await index.lookup(keys[1:]) == {"a": APPROX_CAP}

    async def test_a_history_longer_than_the_cap_keeps_its_head(self, index: BlockIndex) -> None:
        keys = chain(3 * APPROX_CAP, "ap")
        await index.add_approximate("a", keys, ttl_seconds=60)
        assert await index.lookup(keys) == {"a": APPROX_CAP}

    async def test_bad_ttl_is_rejected(self, index: BlockIndex) -> None:
        with pytest.raises(ValueError):
            await index.add_approximate("a", chain(1), ttl_seconds=0)

    # -- listing, stats, concurrency ---------------------------------------------------------

    async def test_stats(self, index: BlockIndex) -> None:
        await index.add("a", chain(5))
        await index.add("b", chain(3))
        await index.add_approximate("c", chain(2, "ap"), ttl_seconds=60)
        await index.set_generation("d", "g")
        assert await index.stats() == IndexStats(pods=4, entries=8, approximate_entries=2)
        assert await index.pods() == {"a", "b", "c", "d"}

    async def test_audit_names_the_pods_it_lacks_under_a_steady_epoch(
        self, index: BlockIndex
    ) -> None:
        epoch, missing = await index.audit(["a", "b"])
        assert missing == {"a", "b"} and epoch
        await index.add("a", chain(2))
        await index.set_generation("c", "g")
        assert await index.audit(["a", "b", "c"]) == (epoch, {"b"})
        assert await index.audit([]) == (epoch, set())

    async def test_concurrent_writers_stay_consistent(self, index: BlockIndex) -> None:
        keys = chain(40)

        async def writer(pod: str) -> None:
            for i in range(0, 40, 4):
                await index.add(pod, keys[i : i + 4])
            await index.remove(pod, keys[30:])

        await asyncio.gather(*(writer(f"p{i}") for i in range(8)))
        assert await index.lookup(keys) == {f"p{i}": 30 for i in range(8)}
        assert (await index.stats()).entries == 8 * 30

    async def test_close_twice(self, index: BlockIndex) -> None:
        await index.close()
        await index.close()
