"""The simulator's AKV cache ops (``--sim-akv``): drop, reposition, drop-aware eviction,
single-prefill restore, and KV-event keys equal to the router's."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from kvgate.kvevents import BlockRemoved, BlockStored
from kvgate.prefix import BlockHasher
from kvgate.prefix.cache_ops import CacheOps, OpHistory, history_block_keys
from kvgate.sim.engine import RequestRejected, SimEngine, StepResult
from kvgate.sim.openai import BadRequest, parse_request
from kvgate.sim.text import ChunkCodec

EngineFactory = Callable[..., SimEngine]
BS = 16
SEG = 320  # tokens per segment (20 blocks)


def _tokens(num_segments: int) -> list[int]:
    return [1000 + (i * 7919) % 20000 for i in range(num_segments * SEG)]


def _history(
    drop: dict[int, tuple[int, ...]], num_segments: int, repo: frozenset[int] = frozenset()
) -> OpHistory:
    ends = [(i + 1) * SEG for i in range(num_segments)]
    return OpHistory.from_ops(CacheOps(drop, repo), ends)


def _stored(steps: list[StepResult]) -> list[bytes]:
    return [
        h
        for step in steps
        for e in step.events
        if isinstance(e, BlockStored)
        for h in e.block_hashes
    ]


def test_events_publish_the_routers_keys(make_engine: EngineFactory) -> None:
    engine = make_engine()
    ids = _tokens(4)
    history = _history({2: (1,)}, 4)
    engine.add_request("a", ids, 1, 0.0, history=history)
    stored = _stored(engine.run_until_idle())
    router_keys = history_block_keys(BlockHasher("sha256", BS), ids, history)
    assert stored[: len(router_keys)] == router_keys
    plain = BlockHasher("sha256", BS).block_keys(ids)
    assert stored[: 3 * SEG // BS] == plain[: 3 * SEG // BS]  # the shared prefix is vLLM's
    assert stored[3 * SEG // BS] != plain[3 * SEG // BS]


def test_next_turn_hits_its_own_history_not_another_sessions(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add_request("t1", _tokens(4), 1, 0.0, history=_history({2: (1,)}, 4))
    engine.run_until_idle()
    turn2 = engine.add_request("t2", _tokens(6), 1, 10.0, history=_history({2: (1,), 4: (3,)}, 6))
    other = engine.add_request("o", _tokens(6), 1, 10.0, history=_history({2: (0,)}, 6))
    engine.run_until_idle(10.0)
    # turn 2 reuses every block of turn 1's prompt
    assert turn2.num_cached_tokens == 4 * SEG
    # another drop shares only what came before the op
    assert other.num_cached_tokens == 3 * SEG


def test_drop_shortens_attention_after_one_cold_prefill(make_engine: EngineFactory) -> None:
    decode_s = {}
    for name, history in (("full", None), ("drop", _history({6: (1, 2, 3, 4, 5)}, 8))):
        engine = make_engine()
        req = engine.add_request(name, _tokens(8), 8, 0.0, history=history)
        steps = engine.run_until_idle()
        decode = [s for s in steps if s.start >= (req.first_token_time or 0)]
        decode_s[name] = decode[0].end - decode[0].start
        assert req.num_cached_tokens == 0  # a cold request is prefilled once, all tokens
    assert decode_s["drop"] < decode_s["full"]


def test_dropped_blocks_are_released_at_once_and_evicted_first(make_engine: EngineFactory) -> None:
    engine = make_engine(num_gpu_blocks=200, max_model_len=3000)
    history = _history({6: (1, 2, 3, 4, 5)}, 8)  # 100 of 160 blocks dropped
    req = engine.add_request("s", _tokens(8), 400, 0.0, history=history)
    engine.step(0.0)
    while req.first_token_time is None:
        engine.step(engine.next_step_time(0.0) or 0.0)
    held = sum(1 for b in req.block_ids if b)
    assert held <= 8 * SEG // BS - 100 + 2  # the dropped blocks went back while it decodes
    engine.run_until_idle(req.first_token_time)
    # another prompt needs the space: the dropped blocks go first, the session's later ones stay
    engine.add_request("x", [5] * (70 * BS), 1, 100.0)
    engine.run_until_idle(100.0)
    again = engine.add_request(
        "s2", _tokens(9), 1, 200.0, history=_history({6: (1, 2, 3, 4, 5)}, 9)
    )
    engine.run_until_idle(200.0)
    assert again.num_cached_tokens >= 8 * SEG - BS


def test_reposition_is_cheap_and_renumbers_positions(make_engine: EngineFactory) -> None:
    engine = make_engine(max_model_len=3 * SEG)
    ids = _tokens(4)  # 1280 tokens, over max_model_len, but 2 segments are dropped first
    with pytest.raises(RequestRejected):
        engine.add_request("plain", ids, 1, 0.0, history=_history({2: (0, 1)}, 4))
    req = engine.add_request("r", ids, 1, 0.0, history=_history({2: (0, 1)}, 4, frozenset({2})))
    engine.run_until_idle()
    assert req.first_token_time is not None
    assert engine.profile.reposition_seconds(SEG) < engine.profile.step_seconds([(0, BS)], [])


def test_cache_field_is_parsed_only_with_sim_akv() -> None:
    codec = ChunkCodec()
    messages = [{"role": "user", "content": f"message {i} " * 30} for i in range(5)]
    body = {"messages": messages, "cache": {"drop": {"3": [1]}, "reposition": [3]}}
    raw = json.dumps(body).encode()
    assert parse_request(raw, True, codec).history is None  # ignored, as vLLM ignores it
    history = parse_request(raw, True, codec, cache_ops=True).history
    assert history is not None and len(history.points) == 1
    point = history.points[0]
    assert point.reposition and point.dropped and point.dropped[0][0] < point.dropped[0][1]
    bad = json.dumps({**body, "cache": {"drop": {"9": [1]}}}).encode()
    parse_request(bad, True, codec)  # ignored without the flag
    with pytest.raises(BadRequest, match="out of range"):
        parse_request(bad, True, codec, cache_ops=True)
    prompt = json.dumps({"prompt": list(range(100, 200)), "cache": {"drop": {"1": [0]}}}).encode()
    with pytest.raises(BadRequest, match="segments"):
        parse_request(prompt, False, codec, cache_ops=True)


def test_adapter_requests_carry_the_lora_key_and_the_ops(make_engine: EngineFactory) -> None:
    """A LoRA request with an op history: every block (prompt and decode) is keyed with the
    adapter and the ops, as the router keys it; events carry the adapter name, then the ops."""
    from kvgate.sim.lora import LoraModule

    sql = LoraModule("sql", "/adapters/sql", 1)
    engine = make_engine()
    ids = _tokens(4)
    history = _history({2: (1,)}, 4)
    req = engine.add_request("a", ids, 40, 0.0, lora=sql, history=history)
    steps = engine.run_until_idle()
    stored = _stored(steps)
    full = len(req.all_token_ids) // BS * BS
    hasher = BlockHasher("sha256", BS)
    want = history_block_keys(hasher, req.all_token_ids[:full], history, lora=sql.key)
    assert stored == want
    assert stored != history_block_keys(hasher, req.all_token_ids[:full], history)
    extra = [k for s in steps for e in s.events if isinstance(e, BlockStored) for k in e.extra_keys]
    op_block = 3 * SEG // BS
    assert extra[0] == ("sql",)
    assert extra[op_block][0] == "sql" and extra[op_block][1][0] == "akv"
    assert all(k == ("sql",) for i, k in enumerate(extra) if i != op_block)


def test_dropped_blocks_are_not_offloaded_to_the_cpu_tier(make_engine: EngineFactory) -> None:
    """With a CPU tier, a released dropped block evicted from the GPU is gone (no live path
    needs it); the session's other blocks, evicted later, are offloaded as usual."""
    from kvgate.kvevents import MEDIUM_CPU
    from kvgate.sim.profile import H100_LLAMA3_8B

    gib = 400 * BS * H100_LLAMA3_8B.kv_bytes_per_token / 1024**3
    engine = make_engine(num_gpu_blocks=200, max_model_len=3000, kv_offloading_size_gib=gib)
    history = _history({6: (1, 2, 3, 4, 5)}, 8)  # blocks 20..119 dropped at offset 2240
    session = engine.add_request("s", _tokens(8), 1, 0.0, history=history)
    engine.run_until_idle()
    dropped = {session.block_hashes[k] for k in history.dropped_blocks(BS)}
    kept = set(session.block_hashes) - dropped
    assert len(dropped) == 100
    events = []
    for i, blocks in enumerate((70, 150)):  # the dropped blocks go first, then the others
        at = 100.0 * (i + 1)
        engine.add_request(f"x{i}", [5 + i] * (blocks * BS), 1, at)
        events += [e for step in engine.run_until_idle(at) for e in step.events]
    to_cpu = {
        h
        for e in events
        if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU
        for h in e.block_hashes
    }
    gpu_removed = {
        h
        for e in events
        if isinstance(e, BlockRemoved) and e.medium == "GPU"
        for h in e.block_hashes
    }
    assert dropped <= gpu_removed  # every dropped block was evicted from the GPU ...
    assert not dropped & to_cpu  # ... and none of them went to the CPU tier
    assert kept & gpu_removed and kept & gpu_removed <= to_cpu
