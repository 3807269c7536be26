"""Paged KV cache with vLLM v1's prefix cache (``BlockPool`` + ``KVCacheManager``).

- ``num_gpu_blocks`` blocks of ``block_size`` tokens; block 0 is vLLM's null block and never
  handed out, so ``num_gpu_blocks - 1`` are usable.
- The prefix cache maps a block hash to the blocks holding it (several blocks may hold the same
  hash when two requests computed the same prefix at the same time, as in vLLM).
- A lookup walks the request's chained block hashes from block 0 and stops at the first miss; at
  most ``(num_tokens - 1) // block_size`` blocks hit, because vLLM always recomputes the last
  prompt token to get logits.
- Free blocks sit in one queue ordered by eviction priority. Freeing a request releases its blocks
  tail first: blocks without a hash go to the front (reused first), cached blocks to the back, so
  the least recently freed cached block is evicted first. A cached block is only evicted when it
  is free and a new block is needed; a hit on a free cached block takes it out of the queue.
- Full blocks are cached (and a ``BlockStored`` event emitted) as soon as their tokens are
  computed; evicting a cached block emits one ``BlockRemoved`` per hash; resetting the prefix
  cache (only possible while no request holds blocks) emits ``AllBlocksCleared``.
- Optional CPU offloading tier (vLLM's ``--kv-offloading-backend native``): ``num_cpu_blocks``
  blocks in host memory, least recently used evicted first. A cached block evicted from the GPU
  (its last copy there) is stored in it (``BlockStored`` with medium ``CPU`` after the GPU's
  ``BlockRemoved``; its eviction from the tier, ``BlockRemoved`` ``CPU``). A request's prefix
  continues into the tier after its GPU hit (``cpu_hit_blocks``): those blocks are copied back
  into new GPU blocks (cached there again, a ``BlockStored`` ``GPU``), count as computed, and
  cost the engine their transfer time instead of their prefill (``engine.py``). Both tiers are
  dropped by a reset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvgate.kvevents import (
    KIND_FULL_ATTENTION,
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
)
from kvgate.sim.request import SimRequest


class KVCacheManager:
    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        num_cpu_blocks: int = 0,
    ) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        if num_cpu_blocks < 0:
            raise ValueError("num_cpu_blocks must be >= 0")
        self.num_cpu_blocks = num_cpu_blocks if enable_caching else 0
        # The CPU tier: hash -> None, front = least recently used (evicted first).
        self._cpu: OrderedDict[bytes, None] = OrderedDict()
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref_cnt = [0] * num_gpu_blocks
        self._hash: list[bytes | None] = [None] * num_gpu_blocks
        # Front = evicted first. Values unused; OrderedDict gives O(1) removal from the middle.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self._cached: dict[bytes, dict[int, None]] = {}
        self._events: list[KVEvent] = []

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests (``vllm:kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / (self.num_gpu_blocks - 1)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(ids) for ids in self._cached.values())

    def is_cached(self, block_hash: bytes) -> bool:
        return block_hash in self._cached

    def cached_prefix_blocks(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a hash chain the cache holds (no side effects)."""
        n = 0
        for h in block_hashes:
            if h not in self._cached:
                break
            n += 1
        return n

    @property
    def num_cpu_cached_blocks(self) -> int:
        return len(self._cpu)

    def cpu_hit_blocks(self, request: SimRequest, gpu_hit_blocks: int) -> int:
        """How many blocks after the request's GPU hit the CPU tier holds (to load back)."""
        if not self._cpu:
            return 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        n = 0
        for h in request.block_hashes[gpu_hit_blocks:max_blocks]:
            if h not in self._cpu:
                break
            n += 1
        return n

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    # -- request lifecycle -----------------------------------------------------------------

    def get_computed_blocks(self, request: SimRequest) -> list[int]:
        """The cached blocks a new request can reuse (longest prefix hit)."""
        if not self.enable_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        cached = self._cached
        for h in request.block_hashes[:max_blocks]:
            ids = cached.get(h)
            if not ids:
                break
            hits.append(next(iter(ids)))
        return hits

    def allocate_slots(
        self, request: SimRequest, num_new_tokens: int, new_computed_blocks: list[int] | None = None
    ) -> bool:
        """Give ``request`` room for ``num_new_tokens`` more tokens; False if blocks run out."""
        bs = self.block_size
        if not new_computed_blocks:
            # Fast path (every decode step): the tokens fit in the blocks already held and no
            # block becomes full, so nothing is allocated or cached.
            total = request.num_computed_tokens + num_new_tokens
            if total <= len(request.block_ids) * bs and (
                not self.enable_caching or total // bs <= request.num_cached_blocks
            ):
                return True
        computed = new_computed_blocks or []
        total = request.num_computed_tokens + len(computed) * bs + num_new_tokens
        num_required = -(-total // bs)
        num_new = num_required - len(request.block_ids) - len(computed)
        ref = self._ref_cnt
        evictable_hits = sum(1 for b in computed if ref[b] == 0)
        if num_new > len(self._free) - evictable_hits:
            return False
        for b in computed:
            if ref[b] == 0:
                del self._free[b]
            ref[b] += 1
        request.block_ids.extend(computed)
        if not request.num_cached_blocks:
            request.num_cached_blocks = len(computed)
        if num_new > 0:
            request.block_ids.extend(self._get_new_blocks(num_new))
        if self.enable_caching:
            self._cache_full_blocks(request, min(total, request.num_tokens))
        return True

    def free(self, request: SimRequest) -> None:
        """Release a finished or preempted request's blocks (tail first)."""
        ref = self._ref_cnt
        free = self._free
        evict_first: list[int] = []
        for b in reversed(request.block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                if self._hash[b] is None or not self.enable_caching:
                    evict_first.append(b)
                else:
                    free[b] = None
        for b in reversed(evict_first):
            free[b] = None
            free.move_to_end(b, last=False)
        request.block_ids = []
        request.num_cached_blocks = 0

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while a request holds blocks."""
        if len(self._free) != self.num_gpu_blocks - 1:
            return False
        self._cached.clear()
        self._cpu.clear()
        self._hash = [None] * self.num_gpu_blocks
        self._events.append(AllBlocksCleared())
        return True

    # -- internals -------------------------------------------------------------------------

    def _get_new_blocks(self, n: int) -> list[int]:
        free = self._free
        out: list[int] = []
        offloaded: list[bytes] = []
        for _ in range(n):
            b, _unused = free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                holders = self._cached[h]
                del holders[b]
                if not holders:
                    del self._cached[h]
                    offloaded.append(h)
                self._hash[b] = None
                # vLLM's GPU block pool states the medium and the (single) KV cache group
                self._events.append(BlockRemoved([h], medium=MEDIUM_GPU, group_idx=0))
            self._ref_cnt[b] = 1
            out.append(b)
        if offloaded and self.num_cpu_blocks:
            self._offload(offloaded)
        return out

    def _offload(self, hashes: list[bytes]) -> None:
        """Store blocks the GPU evicted in the CPU tier, evicting its least recently used."""
        cpu = self._cpu
        stored: list[BlockHash] = []
        for h in hashes:
            if h in cpu:
                cpu.move_to_end(h)
            else:
                cpu[h] = None
                stored.append(h)
        removed: list[BlockHash] = []
        while len(cpu) > self.num_cpu_blocks:
            removed.append(cpu.popitem(last=False)[0])
        if stored:  # vLLM's offloading events carry no token ids
            self._events.append(
                BlockStored(
                    stored,
                    None,
                    [],
                    self.block_size,
                    medium=MEDIUM_CPU,
                    group_idx=0,
                    kv_cache_spec_kind=KIND_FULL_ATTENTION,
                )
            )
        if removed:
            self._events.append(BlockRemoved(removed, medium=MEDIUM_CPU, group_idx=0))

    def touch_cpu(self, request: SimRequest, start: int, count: int) -> None:
        """Mark blocks loaded back from the CPU tier as recently used there."""
        for h in request.block_hashes[start : start + count]:
            if h in self._cpu:
                self._cpu.move_to_end(h)

    def _cache_full_blocks(self, request: SimRequest, num_tokens: int) -> None:
        bs = self.block_size
        start = request.num_cached_blocks
        full = num_tokens // bs
        if start >= full:
            return
        hashes = request.block_hashes
        new_hashes = hashes[start:full]
        for i, h in enumerate(new_hashes, start):
            b = request.block_ids[i]
            self._hash[b] = h
            self._cached.setdefault(h, {})[b] = None
        self._events.append(
            BlockStored(
                block_hashes=list[BlockHash](new_hashes),
                parent_block_hash=hashes[start - 1] if start else None,
                token_ids=request.all_token_ids[start * bs : full * bs],
                block_size=bs,
                medium=MEDIUM_GPU,
                lora_id=request.lora.id if request.lora is not None else None,
                lora_name=request.lora.name if request.lora is not None else None,
                extra_keys=[request.event_extra_keys(i) for i in range(start, full)],
                group_idx=0,
                kv_cache_spec_kind=KIND_FULL_ATTENTION,
            )
        )
        request.num_cached_blocks = full
