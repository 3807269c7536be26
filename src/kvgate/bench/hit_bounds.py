"""Hit-rate bounds of a request sequence: one infinite cache, and one fleet-sized LRU cache.

Both replay the requests in the order a run sent them, each one's ``prefix_units`` cut into full
blocks of ``block_size`` tokens and chained (block *i*'s key hashes block *i - 1*'s key and its
own tokens, as vLLM chains its block hashes). A request hits the leading blocks found in the
cache, at most :func:`kvgate.prefix.max_cacheable_blocks` of them (vLLM always recomputes the
last prompt token), and its blocks are touched when it arrives. Hit rate = hit tokens / prompt
tokens.

- **ideal** (``ideal_hit_rate``): the cache is infinite; every block any earlier request had is
  there. No router on any number of pods can beat it.
- **finite** (``finite_hit_rate``): one LRU cache of ``capacity_blocks`` blocks, the whole
  fleet's KV capacity (:func:`fleet_kv_blocks`: pods x the engines' usable blocks). When a
  request arrives its blocks move to the most recently used end, its last block first and block
  0 last, so that under pressure a prefix's tail is evicted before its head (vLLM frees a
  request's blocks in reverse order for the same reason). It is what a fleet would hit if it were
  one engine with all the fleet's memory and no request ever had to wait: routers that spread a
  prefix over several pods, or evict it by moving sessions, stay below it. It ignores blocks in
  use by running requests (a real engine cannot evict those) and decode tokens, so it is an
  estimate of the reachable, not a proof.

Cost: one hash per full block (the same work as the ideal bound alone) plus one ``OrderedDict``
move per block for the finite one; both bounds come from a single pass.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.bench.workload import BenchRequest
from kvgate.prefix import max_cacheable_blocks


@dataclass(frozen=True, slots=True)
class HitRateBounds:
    ideal: float  # one infinite cache
    finite: float  # one LRU cache of capacity_blocks; NaN without a capacity
    capacity_blocks: int | None
    prompt_tokens: int


def fleet_kv_blocks(pods: int, num_gpu_blocks: int) -> int:
    """Blocks the whole fleet can hold: pods x (num_gpu_blocks - 1). vLLM's block 0 is the
    null block and never caches anything."""
    return max(0, pods) * max(0, num_gpu_blocks - 1)


def _leading_hits(keys: list[int], cached: set[int] | OrderedDict[int, None], limit: int) -> int:
    hits = 0
    for key in keys:
        if hits >= limit or key not in cached:
            break
        hits += 1
    return hits


def hit_rate_bounds(
    requests: Iterable[BenchRequest], block_size: int = 16, capacity_blocks: int | None = None
) -> HitRateBounds:
    """The ideal and (with ``capacity_blocks``) the finite hit rate of ``requests`` in order."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    seen: set[int] = set()
    lru: OrderedDict[int, None] = OrderedDict()
    capacity = capacity_blocks if capacity_blocks is not None and capacity_blocks >= 0 else None
    total_tokens = ideal_hits = finite_hits = 0
    for request in requests:
        units = request.prefix_units
        total_tokens += len(units)
        keys: list[int] = []
        parent = 0
        for block in zip(*[iter(units)] * block_size, strict=False):  # full blocks only
            parent = hash((parent, block))
            keys.append(parent)
        limit = max_cacheable_blocks(len(units), block_size)
        ideal_hits += _leading_hits(keys, seen, limit)
        seen.update(keys)
        if capacity is None:
            continue
        finite_hits += _leading_hits(keys, lru, limit)
        for key in reversed(keys):  # the head ends most recent: tails are evicted first
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
    if not total_tokens:
        return HitRateBounds(math.nan, math.nan, capacity, 0)
    finite = math.nan if capacity is None else finite_hits * block_size / total_tokens
    return HitRateBounds(ideal_hits * block_size / total_tokens, finite, capacity, total_tokens)
