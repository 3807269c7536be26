from __future__ import annotations

from kvgate.kvevents import AllBlocksCleared, BlockRemoved, BlockStored
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.kv_cache import KVCacheManager
from kvgate.sim.request import SimRequest

BS = 4


def _request(tokens: list[int], rid: str = "r") -> SimRequest:
    req = SimRequest(request_id=rid, prompt_token_ids=tokens, max_tokens=1, arrival_time=0.0)
    req.update_block_hashes(PrefixBlockHasher("sha256", BS, None), BS)
    return req


def _prefill(kv: KVCacheManager, req: SimRequest) -> bool:
    hits = kv.get_computed_blocks(req)
    ok = kv.allocate_slots(req, req.num_tokens - len(hits) * BS, hits)
    if ok:
        req.num_computed_tokens = req.num_tokens
    return ok


def test_full_blocks_are_cached_and_announced_once() -> None:
    kv = KVCacheManager(num_gpu_blocks=10, block_size=BS)
    req = _request(list(range(10)))  # 2 full blocks + 2 tokens
    assert _prefill(kv, req)
    events = kv.take_events()
    assert len(events) == 1
    stored = events[0]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == req.block_hashes[:2]
    assert stored.parent_block_hash is None
    assert stored.token_ids == list(range(8))
    assert stored.extra_keys == [None, None]
    assert kv.num_free_blocks == 9 - 3


def test_hit_is_capped_one_token_short_of_the_prompt() -> None:
    kv = KVCacheManager(num_gpu_blocks=10, block_size=BS)
    first = _request(list(range(8)))
    assert _prefill(kv, first)
    kv.free(first)
    again = _request(list(range(8)))
    # Both blocks are cached but vLLM recomputes the last prompt token: only block 0 hits.
    assert len(kv.get_computed_blocks(again)) == 1
    longer = _request(list(range(9)))
    assert len(kv.get_computed_blocks(longer)) == 2


def test_eviction_takes_least_recently_freed_cached_block_first() -> None:
    kv = KVCacheManager(num_gpu_blocks=6, block_size=BS)  # 5 usable blocks
    a = _request([1] * 4 + [2] * 4 + [9], "a")
    b = _request([3] * 4 + [9], "b")
    assert _prefill(kv, a)
    assert _prefill(kv, b)
    kv.free(a)  # a's tail first: partial block (front), then block 1, then block 0
    kv.free(b)
    kv.take_events()
    c = _request([7] * 8 + [9], "c")  # needs 3 blocks: the 2 partial ones, then a's oldest
    assert _prefill(kv, c)
    removed = [e for e in kv.take_events() if isinstance(e, BlockRemoved)]
    assert [e.block_hashes[0] for e in removed] == [a.block_hashes[1]]
    assert kv.is_cached(a.block_hashes[0]) and kv.is_cached(b.block_hashes[0])


def test_hit_on_free_block_protects_it_from_eviction() -> None:
    kv = KVCacheManager(num_gpu_blocks=4, block_size=BS)  # 3 usable
    a = _request([1] * 4 + [2], "a")
    assert _prefill(kv, a)
    kv.free(a)
    again = _request([1] * 4 + [5] * 4 + [6], "b")
    hits = kv.get_computed_blocks(again)
    assert len(hits) == 1
    assert kv.allocate_slots(again, again.num_tokens - BS, hits)
    assert kv.is_cached(a.block_hashes[0])
    assert kv.num_free_blocks == 0
    other = _request([8] * 2, "c")
    assert not kv.allocate_slots(other, 2)


def test_reset_prefix_cache_refused_while_blocks_are_held() -> None:
    kv = KVCacheManager(num_gpu_blocks=10, block_size=BS)
    req = _request(list(range(9)))
    assert _prefill(kv, req)
    assert not kv.reset_prefix_cache()
    kv.free(req)
    kv.take_events()
    assert kv.reset_prefix_cache()
    assert kv.take_events() == [AllBlocksCleared()]
    assert not kv.is_cached(req.block_hashes[0])
    assert kv.usage == 0.0


def test_salt_isolates_and_is_published_untagged() -> None:
    kv = KVCacheManager(num_gpu_blocks=10, block_size=BS)
    hasher = PrefixBlockHasher("sha256", BS, None)
    plain = _request(list(range(9)))
    salted = SimRequest("s", list(range(9)), 1, 0.0, cache_salt="tenant-a")
    salted.update_block_hashes(hasher, BS)
    assert salted.block_hashes[0] != plain.block_hashes[0]
    assert _prefill(kv, salted)
    stored = kv.take_events()[0]
    assert isinstance(stored, BlockStored)
    assert stored.extra_keys == [("tenant-a",), None]
    assert kv.get_computed_blocks(plain) == []


def test_caching_disabled_hits_nothing_and_emits_nothing() -> None:
    kv = KVCacheManager(num_gpu_blocks=10, block_size=BS, enable_caching=False)
    a = _request(list(range(9)))
    assert _prefill(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(_request(list(range(9)))) == []
    assert kv.take_events() == []
