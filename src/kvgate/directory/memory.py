"""In-process `BlockIndex`: for one router process, tests and the demo.

Layout. Every known pod owns a *slot*: a bit position. The forward index maps a block key to an
int bitmask of the slots holding it (exact in any medium, or approximate). `lookup` reads the
masks of the chain in growing chunks (`map(dict.get)`, in C) and keeps a running AND of them: a
pod's count is where its bit drops out. Neighbouring blocks are mostly held by the same pods, so
only the positions where the mask differs from the previous block's (found in C with
`map(operator.ne)` and `list.index`) are visited in Python; the scan stops when no bit is left. Each pod also keeps its own entries (the reverse index): exact entries
as `key -> media bitmask` in insertion order, approximate ones as `key -> expiry` in the order
they were last written (an `OrderedDict`: one time to live per router, so that is also the order
they expire in).

Copies. A key held once in a medium costs nothing more than its bit in the media bitmask; only
a key with two or more copies (vLLM caching one hash in several blocks) has an entry in the
pod's overflow map `copies[medium bit][key] = count` (2 .. `MAX_COPIES`), which the per-pod cap,
a clear and a new generation drop with the key.

Generations and clearing. Clearing a pod gives it a fresh slot at once, so the old bit stops
counting in the same instant without touching the forward index; the old bit is then erased from
the forward index in chunks (O(the pod's entries), yielding to the event loop) and its slot is
reused only afterwards.

Bounds. At most `max_blocks_per_pod` exact entries per pod (the oldest-inserted go first) and
`max_approximate_per_pod` approximate ones (the least recently written go first; a write of
more keys keeps its first ones, the head a lookup starts from). Expired approximate entries are
collected lazily on lookup (`COLLECT_PER_LOOKUP` a lookup, over all pods) and on writes to the
pod (as many), from the oldest written; one written with a shorter time to live than an older one is
collected when it reaches the front, and never counts once expired (a lookup checks the held
keys of a pod whose expired entries are not all collected yet). A write of many approximate keys (a long prompt's routing history) yields
to the event loop every `HISTORY_CHUNK_KEYS` keys: at the cap, 65,536 keys written at once held
the loop 0.2 s with the heap this used before.

Export. `export_pod` copies one pod's entries at one instant (dict copies, in C), so that
`FallbackIndex` can rebuild the pod in the shared index after an outage; the snapshot turns
them into write batches lazily, chunk by chunk.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import operator
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kvgate.directory.base import (
    DEFAULT_MAX_APPROXIMATE_PER_POD,
    DEFAULT_MAX_BLOCKS_PER_POD,
    DEFAULT_MEDIUM,
    HISTORY_CHUNK_KEYS,
    MAX_COPIES,
    IndexStats,
    check_caps,
    check_generation,
    check_medium,
    check_pod,
    check_ttl,
)
from kvgate.prefix import BlockKey

_CLEANUP_CHUNK = 8192
COLLECT_PER_LOOKUP = 8192
"""Expired approximate entries one lookup (over all pods) or one write collects (~4 ms): after
an idle longer than the TTL, collecting every pod's at once held the loop 0.41 s (8 pods of
100k), and a write to a pod of 100k 41 ms."""


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """One pod's entries at one instant (`MemoryBlockIndex.export_pod`)."""

    generation: str | None
    exact: dict[BlockKey, int]  # key -> media bitmask, oldest first
    media: dict[int, str]  # medium bit -> name
    approximate: dict[BlockKey, float]  # key -> expiry (the index's clock)
    copies: dict[int, dict[BlockKey, int]]  # medium bit -> key -> copies, where more than one

    def exact_batches(self, size: int) -> Iterator[tuple[str, list[BlockKey]]]:
        """(medium, keys) batches of about `size` keys covering every exact entry, in the
        pod's insertion order within each medium (a key held in two media is in both, a key
        with n copies in a medium n times in a row: `add` counts repetitions as copies)."""
        pending: dict[str, list[BlockKey]] = {}
        no_copies: dict[BlockKey, int] = {}
        for key, mask in self.exact.items():
            for bit, medium in self.media.items():
                if mask & bit:
                    batch = pending.setdefault(medium, [])
                    batch.append(key)
                    n = self.copies.get(bit, no_copies).get(key)
                    if n is not None:
                        batch.extend(itertools.repeat(key, n - 1))
                    if len(batch) >= size:
                        yield medium, pending.pop(medium)
        yield from pending.items()

    def approximate_batches(self, now: float, size: int) -> Iterator[tuple[float, list[BlockKey]]]:
        """(remaining ttl, keys) batches of the entries unexpired at `now`: keys that expire
        together stay together, so each keeps its own remaining time to live."""
        by_expiry: dict[float, list[BlockKey]] = {}
        for key, expiry in self.approximate.items():
            if expiry > now:
                by_expiry.setdefault(expiry, []).append(key)
        for expiry, keys in sorted(by_expiry.items()):
            for i in range(0, len(keys), size):
                yield expiry - now, keys[i : i + size]


@dataclass(eq=False, slots=True)
class _Pod:
    slot: int
    generation: str | None
    exact: dict[BlockKey, int] = field(default_factory=dict)  # key -> media bitmask
    # medium bit -> key -> copies (2 .. MAX_COPIES) of the exact entries with more than one
    copies: dict[int, dict[BlockKey, int]] = field(default_factory=dict)
    # key -> expiry (clock seconds), least recently written first
    approx: collections.OrderedDict[BlockKey, float] = field(
        default_factory=collections.OrderedDict
    )

    @property
    def bit(self) -> int:
        return 1 << self.slot

    def add_copies(self, medium_bit: int, key: BlockKey, more: int) -> None:
        """`more` copies of `key`, which is held in the medium already (MAX_COPIES at most)."""
        copies = self.copies.get(medium_bit)
        if copies is None:
            copies = self.copies[medium_bit] = {}
        copies[key] = min(copies.get(key, 1) + more, MAX_COPIES)


class MemoryBlockIndex:
    """`BlockIndex` held in this process's memory."""

    def __init__(
        self,
        *,
        max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
        max_approximate_per_pod: int = DEFAULT_MAX_APPROXIMATE_PER_POD,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_caps(max_blocks_per_pod, max_approximate_per_pod)
        self._max_exact = max_blocks_per_pod
        self._max_approx = max_approximate_per_pod
        self._clock = clock
        self._masks: dict[BlockKey, int] = {}
        self._pods: dict[str, _Pod] = {}
        self._written: dict[str, float] = {}  # pod -> when its generation last wrote
        self._media: dict[str, int] = {}  # medium name -> bit
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._erasing: set[asyncio.Task[None]] = set()  # erases that outlive their caller

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock approximate expiries are measured on."""
        return self._clock

    # -- lookup ------------------------------------------------------------------------------

    async def lookup(
        self,
        keys: Sequence[BlockKey],
        pods: Collection[str] | None = None,
        *,
        medium: str | None = None,
    ) -> dict[str, int]:
        if pods is None:
            states = list(self._pods.items())
        else:
            states = [(p, s) for p in set(pods) if (s := self._pods.get(p)) is not None]
        if not states or not keys:
            return {}
        now = self._clock()
        active = 0
        budget = COLLECT_PER_LOOKUP
        behind: list[tuple[str, _Pod]] = []  # pods with expired entries left to collect
        for pod, state in states:
            budget = self._collect_expired(state, now, budget)
            if budget == 0 and _has_expired(state, now):
                behind.append((pod, state))
            active |= state.bit
        if medium is not None:
            return self._lookup_in(medium, keys, states, now)
        result = self._lookup_masks(keys, states, active)
        for pod, state in behind:  # their expired entries must not count
            if result.get(pod):
                held = _unexpired_head(state, keys, result[pod], now)
                if held:
                    result[pod] = held
                else:
                    del result[pod]
        return result

    def _lookup_masks(
        self, keys: Sequence[BlockKey], states: list[tuple[str, _Pod]], active: int
    ) -> dict[str, int]:
        """The leading keys each pod holds, read from the forward index's bit masks."""
        result: dict[str, int] = {}
        get, zero, n = self._masks.get, itertools.repeat(0), len(keys)
        start, width = 0, 64
        while start < n and active:
            # Masks of the next chunk; a mask changes the running AND only where it differs
            # from the previous block's, so only those positions are visited in Python.
            masks = list(map(get, keys[start : start + width], zero))
            differs = list(map(operator.ne, masks, masks[1:]))
            i = 0
            while True:
                kept = active & masks[i]
                if kept != active:
                    for pod, state in states:
                        if state.bit & active and not state.bit & kept and start + i:
                            result[pod] = start + i
                    active = kept
                    if not active:
                        break
                try:
                    i = differs.index(True, i) + 1
                except ValueError:
                    break
            start += len(masks)
            width *= 4
        for pod, state in states:
            if state.bit & active:
                result[pod] = n
        return result

    def _lookup_in(
        self, medium: str, keys: Sequence[BlockKey], states: list[tuple[str, _Pod]], now: float
    ) -> dict[str, int]:
        """`lookup` counting only entries in `medium`: one walk of the chain per pod."""
        bit = self._media.get(medium, 0)
        approximate_counts = medium == DEFAULT_MEDIUM
        result: dict[str, int] = {}
        for pod, state in states:
            exact, approx = state.exact, state.approx
            n = 0
            for key in keys:
                if not exact.get(key, 0) & bit and not (
                    approximate_counts and approx.get(key, 0.0) > now
                ):
                    break
                n += 1
            if n:
                result[pod] = n
        return result

    # -- writes ------------------------------------------------------------------------------

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        check_pod(pod)
        check_medium(medium)
        state = self._pods.get(pod)
        if state is None:
            state = self._new_pod(pod, generation)
        elif generation is not None:
            if state.generation is None:
                state.generation = generation
            elif state.generation != generation:
                return False
        medium_bit = self._medium_bit(medium)
        bit = state.bit
        masks = self._masks
        exact = state.exact
        fresh = [key for key in keys if key not in exact]
        if len(fresh) != len(keys):  # some are held already (maybe in another medium)
            for key in keys:
                held = exact.get(key)
                if held is None:
                    continue
                if held & medium_bit:
                    state.add_copies(medium_bit, key, 1)
                else:
                    exact[key] = held | medium_bit
        new = dict.fromkeys(fresh, medium_bit)
        exact.update(new)
        if len(new) != len(fresh):  # a new key repeated in `keys`: its repetitions are copies
            for key, n in collections.Counter(fresh).items():
                if n > 1:
                    state.add_copies(medium_bit, key, n - 1)
        get = masks.get
        for key in new:
            masks[key] = get(key, 0) | bit
        if state.approx:
            for key in new:
                state.approx.pop(key, None)
        if len(exact) > self._max_exact:
            self._evict_exact(state, len(exact) - self._max_exact)
        if generation is not None:
            self._written[pod] = self._clock()
        return True

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        check_pod(pod)
        check_medium(medium)
        state = self._pods.get(pod)
        if state is None:
            return True
        if generation is not None and state.generation not in (None, generation):
            return False
        if generation is not None and state.generation == generation:
            self._written[pod] = self._clock()
        medium_bit = self._media.get(medium, 0)
        exact = state.exact
        copies = state.copies.get(medium_bit)
        for key in keys:
            held = exact.get(key)
            if held is not None:
                if copies and key in copies:  # a copy is left in this medium
                    n = copies.pop(key) - 1
                    if n > 1:
                        copies[key] = n
                    continue
                left = held & ~medium_bit
                if left:
                    exact[key] = left
                    continue
                del exact[key]  # an exact entry never coexists with an approximate one
            elif state.approx.pop(key, None) is None:
                continue
            self._drop_bit(key, state.bit)
        return True

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        check_pod(pod)
        check_ttl(ttl_seconds)
        state = self._pods.get(pod) or self._new_pod(pod, None)
        if len(keys) > self._max_approx:  # the head: a longer history's rest would evict it
            keys = keys[: self._max_approx]
        for start in range(0, len(keys), HISTORY_CHUNK_KEYS):
            if start:
                await asyncio.sleep(0)
                if self._pods.get(pod) is not state:
                    return  # cleared or forgotten meanwhile: the rest no longer applies
            chunk = keys[start : start + HISTORY_CHUNK_KEYS]
            self._write_approximate(state, chunk, ttl_seconds)

    def _write_approximate(self, state: _Pod, keys: Sequence[BlockKey], ttl: float) -> None:
        now = self._clock()
        self._collect_expired(state, now, COLLECT_PER_LOOKUP)  # the cap below drops the rest
        expiry = now + ttl
        bit = state.bit
        masks = self._masks
        exact, approx = state.exact, state.approx
        for key in keys:
            if key in exact:
                continue
            if key in approx:
                approx.move_to_end(key)
            else:
                masks[key] = masks.get(key, 0) | bit
            approx[key] = expiry
        for _ in range(len(approx) - self._max_approx):
            key, _expiry = approx.popitem(last=False)
            self._drop_bit(key, bit)  # never exact too: an exact entry replaces it

    # -- pods and generations ----------------------------------------------------------------

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        state = self._pods.get(pod)
        if state is None or (state.generation and generation not in (None, state.generation)):
            return  # unknown, or another generation's
        await self._replace(pod, state, state.generation)

    async def forget_pod(self, pod: str) -> None:
        self._written.pop(pod, None)
        state = self._pods.pop(pod, None)
        if state is not None:
            await self._erase(state)

    async def set_generation(self, pod: str, generation: str) -> bool:
        check_pod(pod)
        check_generation(generation)
        state = self._pods.get(pod)
        if state is not None and state.generation == generation:
            return False
        self._written[pod] = self._clock()
        if state is None:
            self._new_pod(pod, generation)
        elif state.generation is None:
            state.generation = generation
        else:
            await self._replace(pod, state, generation)
        return True

    async def owner_silent(self, pod: str, generation: str, seconds: float) -> bool:
        state = self._pods.get(pod)
        if state is None or state.generation in (None, generation):
            return False
        return self._clock() - self._written.get(pod, -math.inf) >= seconds

    async def get_generation(self, pod: str) -> str | None:
        state = self._pods.get(pod)
        return None if state is None else state.generation

    async def pods(self) -> set[str]:
        return set(self._pods)

    def export_pod(self, pod: str) -> PodSnapshot | None:
        """A copy of `pod`'s generation and entries now (None if the pod is unknown)."""
        state = self._pods.get(pod)
        if state is None:
            return None
        media = {bit: name for name, bit in self._media.items()}
        copies = {bit: dict(keys) for bit, keys in state.copies.items() if keys}
        return PodSnapshot(state.generation, dict(state.exact), media, dict(state.approx), copies)

    async def audit(self, pods: Collection[str]) -> tuple[str, set[str]]:
        return "memory", {pod for pod in pods if pod not in self._pods}  # it loses nothing

    async def stats(self) -> IndexStats:
        return IndexStats(
            pods=len(self._pods),
            entries=sum(len(s.exact) for s in self._pods.values()),
            approximate_entries=sum(len(s.approx) for s in self._pods.values()),
        )

    async def close(self) -> None:
        for task in self._erasing:
            task.cancel()
        await asyncio.gather(*self._erasing, return_exceptions=True)

    # -- internals ---------------------------------------------------------------------------

    def _new_pod(self, pod: str, generation: str | None) -> _Pod:
        if self._free_slots:
            slot = heapq.heappop(self._free_slots)
        else:
            slot = self._next_slot
            self._next_slot += 1
        state = _Pod(slot=slot, generation=generation)
        self._pods[pod] = state
        return state

    async def _replace(self, pod: str, old: _Pod, generation: str | None) -> None:
        """Give `pod` a fresh, empty slot now; erase the old one's bits afterwards."""
        del self._pods[pod]
        self._new_pod(pod, generation)
        await self._erase(old)

    async def _erase(self, state: _Pod) -> None:
        """Erase a detached pod state (`_erase_now`); a caller cancelled meanwhile (a
        subscription stopped) leaves it to finish in a task of its own. Cancelled halfway,
        its slot was never freed and its keys stayed in the forward index for good."""
        try:
            await self._erase_now(state)
        except asyncio.CancelledError:
            task = asyncio.ensure_future(self._erase_now(state))  # erasing twice is harmless
            self._erasing.add(task)
            task.add_done_callback(self._erasing.discard)
            raise

    async def _erase_now(self, state: _Pod) -> None:
        """Remove a detached pod state's bit from the forward index, then free its slot."""
        keys: Iterable[BlockKey] = itertools.chain(state.exact, state.approx)
        for n, key in enumerate(keys, 1):
            self._drop_bit(key, state.bit)
            if n % _CLEANUP_CHUNK == 0:
                await asyncio.sleep(0)
        heapq.heappush(self._free_slots, state.slot)

    def _drop_bit(self, key: BlockKey, bit: int) -> None:
        left = self._masks.get(key, 0) & ~bit
        if left:
            self._masks[key] = left
        else:
            self._masks.pop(key, None)

    def _medium_bit(self, medium: str) -> int:
        bit = self._media.get(medium)
        if bit is None:
            bit = self._media[medium] = 1 << len(self._media)
        return bit

    def _evict_exact(self, state: _Pod, count: int) -> None:
        victims = list(itertools.islice(state.exact, count))
        for key in victims:
            del state.exact[key]
            for copies in state.copies.values():
                copies.pop(key, None)
            if key not in state.approx:
                self._drop_bit(key, state.bit)

    def _collect_expired(self, state: _Pod, now: float, budget: int) -> int:
        """Drop up to `budget` expired entries, oldest first; the budget left."""
        approx = state.approx
        while approx and budget:
            key, expiry = next(iter(approx.items()))
            if expiry > now:
                break
            del approx[key]
            self._drop_bit(key, state.bit)  # never exact too: an exact entry replaces it
            budget -= 1
        return budget


def _has_expired(state: _Pod, now: float) -> bool:
    return bool(state.approx) and next(iter(state.approx.values())) <= now


def _unexpired_head(state: _Pod, keys: Sequence[BlockKey], held: int, now: float) -> int:
    """How many of the first `held` keys the pod holds once its expired entries are left out
    (a walk of them, for a pod whose expired entries are not all collected yet)."""
    approx = state.approx
    for i, key in enumerate(itertools.islice(keys, held)):
        expiry = approx.get(key)
        if expiry is not None and expiry <= now:
            return i
    return held
