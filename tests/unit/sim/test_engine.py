from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgate.kvevents import AllBlocksCleared, BlockStored
from kvgate.sim.engine import RequestRejected, SimEngine
from kvgate.sim.profile import H100_LLAMA3_8B

EngineFactory = Callable[..., SimEngine]


def prompt(n: int, offset: int = 0) -> list[int]:
    return [1000 + offset + i for i in range(n)]


def _ttft(req_arrival: float, first_token: float | None) -> float:
    assert first_token is not None
    return first_token - req_arrival


def test_same_long_prompt_twice_hits_every_full_block_and_is_faster(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    first = engine.add_request("a", prompt(1000), 8, arrival_time=0.0)
    engine.run_until_idle()
    second = engine.add_request("b", prompt(1000), 8, arrival_time=10.0)
    engine.run_until_idle(10.0)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 1000 // 16 * 16
    ttft_first = _ttft(0.0, first.first_token_time)
    ttft_second = _ttft(10.0, second.first_token_time)
    assert ttft_second < ttft_first / 3
    assert engine.stats.prefix_cache_queries == 2000
    assert engine.stats.prefix_cache_hits == 992
    assert second.output_token_ids == first.output_token_ids


def test_ttft_grows_with_uncached_prompt_tokens(make_engine: EngineFactory) -> None:
    engine = make_engine()
    ttfts = []
    for i, n in enumerate((500, 2000, 6000)):
        req = engine.add_request(str(i), prompt(n, offset=10 * n), 1, arrival_time=100.0 * i)
        engine.run_until_idle(100.0 * i)
        ttfts.append(_ttft(100.0 * i, req.first_token_time))
    assert ttfts[0] < ttfts[1] < ttfts[2]


def test_queued_requests_wait_as_the_profile_predicts(make_engine: EngineFactory) -> None:
    budget = 2048
    engine = make_engine(max_num_batched_tokens=budget)
    reqs = [
        engine.add_request(str(i), prompt(budget, offset=budget * i), 1, arrival_time=0.0)
        for i in range(6)
    ]
    engine.run_until_idle()
    one_prefill = H100_LLAMA3_8B.step_seconds([(0, budget)], [])
    for k, req in enumerate(reqs, start=1):
        assert _ttft(0.0, req.first_token_time) == pytest.approx(k * one_prefill)


def test_long_prompt_is_prefilled_in_chunks(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_batched_tokens=4096)
    req = engine.add_request("long", prompt(10000), 1, arrival_time=0.0)
    steps = engine.run_until_idle()
    assert len(steps) == 3
    expected = sum(
        H100_LLAMA3_8B.step_seconds([chunk], [])
        for chunk in ((0, 4096), (4096, 4096), (8192, 1808))
    )
    assert _ttft(0.0, req.first_token_time) == pytest.approx(expected)


def test_decoding_batch_respects_max_num_seqs(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=3)
    for i in range(7):
        engine.add_request(str(i), prompt(20, offset=100 * i), 4, arrival_time=0.0)
    steps = engine.run_until_idle()
    assert max(len({id(r) for r, _ in s.tokens}) for s in steps) == 3
    assert engine.stats.finished_requests == 7
    assert engine.stats.generation_tokens == 28


def test_step_counters_say_how_many_decodes_each_prefill_held_up(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    for i in range(3):
        engine.add_request(f"d{i}", prompt(20, offset=100 * i), 40, arrival_time=0.0)
    first = engine.run_until_idle(0.0)
    stats = engine.stats
    assert (stats.prefill_steps, stats.decodes_in_prefill_steps) == (1, 0)
    for i in range(3):  # three decode for a while ...
        engine.add_request(f"e{i}", prompt(20, offset=1000 + 100 * i), 40, arrival_time=10.0)
    engine.add_request("long", prompt(3000), 1, arrival_time=10.1)  # ... beside one prefill
    steps = first + engine.run_until_idle(10.0)
    assert stats.prefill_steps == 3
    assert stats.decodes_in_prefill_steps == 3  # the long prompt's one step held up 3 decodes
    assert stats.busy_seconds == pytest.approx(sum(s.end - s.start for s in steps))
    assert 0 < stats.prefill_step_seconds < stats.busy_seconds


def test_preemption_by_recompute_when_blocks_run_out(make_engine: EngineFactory) -> None:
    # 9 usable blocks of 16 tokens: two requests growing to 8 blocks each cannot both stay.
    engine = make_engine(num_gpu_blocks=10, max_model_len=144, enable_prefix_caching=False)
    a = engine.add_request("a", prompt(40), 80, arrival_time=0.0)
    b = engine.add_request("b", prompt(40, offset=500), 80, arrival_time=0.0)
    engine.run_until_idle()
    assert engine.stats.preemptions >= 1
    assert b.num_preemptions >= 1
    assert len(a.output_token_ids) == len(b.output_token_ids) == 80
    alone = make_engine(num_gpu_blocks=10, max_model_len=144, enable_prefix_caching=False)
    b_alone = alone.add_request("b", prompt(40, offset=500), 80, arrival_time=0.0)
    alone.run_until_idle()
    assert b.output_token_ids == b_alone.output_token_ids


def test_reset_prefix_cache_is_published_with_the_next_step(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add_request("a", prompt(100), 2, arrival_time=0.0)
    steps = engine.run_until_idle()
    assert any(isinstance(e, BlockStored) for s in steps for e in s.events)
    assert engine.reset_prefix_cache()
    engine.add_request("b", prompt(100), 2, arrival_time=5.0)
    steps = engine.run_until_idle(5.0)
    assert isinstance(steps[0].events[0], AllBlocksCleared)
    assert engine.stats.prefix_cache_hits == 0


def test_restart_forgets_everything(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add_request("a", prompt(100), 2, arrival_time=0.0)
    engine.run_until_idle()
    pending = engine.add_request("b", prompt(50), 2, arrival_time=1.0)
    lost = engine.restart()
    assert lost == [pending]
    assert engine.stats.finished_requests == 0
    again = engine.add_request("c", prompt(100), 2, arrival_time=2.0)
    engine.run_until_idle(2.0)
    assert again.num_cached_tokens == 0


def test_runs_are_deterministic(make_engine: EngineFactory) -> None:
    def run() -> list[tuple[float | None, list[int]]]:
        engine = make_engine(max_num_batched_tokens=512, num_gpu_blocks=64, max_model_len=1000)
        reqs = [
            engine.add_request(
                str(i), prompt(100 + 37 * i, offset=i % 3), 20, arrival_time=0.01 * i
            )
            for i in range(12)
        ]
        engine.run_until_idle()
        return [(r.first_token_time, r.output_token_ids) for r in reqs]

    assert run() == run()


def test_requests_vllm_would_refuse_are_rejected(make_engine: EngineFactory) -> None:
    engine = make_engine(max_model_len=1000)
    with pytest.raises(RequestRejected, match="maximum context length is 1000"):
        engine.add_request("a", prompt(1000), 1, arrival_time=0.0)
    with pytest.raises(RequestRejected, match="max_tokens"):
        engine.add_request("b", prompt(900), 200, arrival_time=0.0)
    with pytest.raises(RequestRejected):
        engine.add_request("c", [], 1, arrival_time=0.0)
    assert not engine.has_unfinished


def test_late_arrival_waits_for_the_next_step(make_engine: EngineFactory) -> None:
    engine = make_engine()
    a = engine.add_request("a", prompt(3000), 1, arrival_time=0.0)
    b = engine.add_request("b", prompt(10, offset=9000), 1, arrival_time=0.001)
    steps = engine.run_until_idle()
    assert steps[0].start == 0.0 and len(steps[0].tokens) == 1
    assert b.first_token_time is not None and a.first_token_time is not None
    assert b.first_token_time > a.first_token_time


def _gib(blocks: int) -> float:
    return blocks * 16 * H100_LLAMA3_8B.kv_bytes_per_token / 1024**3


def test_cpu_offloading_tier_keeps_evicted_blocks_and_loads_them_back(
    make_engine: EngineFactory,
) -> None:
    """64 GPU blocks, a 128-block CPU tier: a second prompt evicts the first from the GPU into
    the CPU tier, and the first prompt again hits there, faster than recomputing, slower than
    a GPU hit."""
    from kvgate.kvevents import MEDIUM_CPU, BlockRemoved

    engine = make_engine(num_gpu_blocks=64, kv_offloading_size_gib=_gib(128), max_model_len=1008)
    assert engine.kv_cache.num_cpu_blocks == 128
    first = engine.add_request("a", prompt(960), 1, arrival_time=0.0)
    engine.run_until_idle()
    engine.add_request("b", prompt(960, offset=5000), 1, arrival_time=10.0)
    events = [e for step in engine.run_until_idle(10.0) for e in step.events]
    offloaded = [e for e in events if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU]
    # b's 61 blocks took the free ones (a's uncached last block and 2 never used) and evicted
    # 57 of a's 60 cached ones (least recently freed, i.e. its tail, first) to the CPU tier
    assert sum(len(e.block_hashes) for e in offloaded) == 57
    gpu_removed = [e for e in events if isinstance(e, BlockRemoved) and e.medium == "GPU"]
    assert {h for e in gpu_removed for h in e.block_hashes} >= set(offloaded[0].block_hashes)
    on_gpu = engine.kv_cache.cached_prefix_blocks(first.block_hashes)
    again = engine.add_request("c", prompt(960), 1, arrival_time=20.0)
    events = [e for step in engine.run_until_idle(20.0) for e in step.events]
    assert again.num_cached_tokens == 944  # every full block but the last token's
    loaded = _ttft(20.0, again.first_token_time)
    recompute = _ttft(0.0, first.first_token_time)
    gpu_hit = H100_LLAMA3_8B.step_seconds([(944, 16)], [])
    assert gpu_hit < loaded < recompute
    assert loaded == pytest.approx(gpu_hit + H100_LLAMA3_8B.load_seconds(944 - on_gpu * 16))
    # Loaded blocks are cached on the GPU again (and stay in the CPU tier).
    stored_gpu = [e for e in events if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert sum(len(e.block_hashes) for e in stored_gpu) >= 59 - on_gpu


def test_cpu_tier_evicts_least_recently_used_and_says_so(make_engine: EngineFactory) -> None:
    from kvgate.kvevents import MEDIUM_CPU, BlockRemoved

    engine = make_engine(num_gpu_blocks=20, kv_offloading_size_gib=_gib(16), max_model_len=288)
    events = []
    for i in range(4):
        engine.add_request(str(i), prompt(272, offset=1000 * i), 1, arrival_time=10.0 * i)
        events += [e for step in engine.run_until_idle(10.0 * i) for e in step.events]
    assert engine.kv_cache.num_cpu_cached_blocks == 16
    assert any(isinstance(e, BlockRemoved) and e.medium == MEDIUM_CPU for e in events)


def test_no_offloading_tier_by_default(make_engine: EngineFactory) -> None:
    engine = make_engine(num_gpu_blocks=20, max_model_len=288)
    events = []
    for i in range(3):
        engine.add_request(str(i), prompt(272, offset=1000 * i), 1, arrival_time=10.0 * i)
        events += [e for step in engine.run_until_idle(10.0 * i) for e in step.events]
    assert engine.kv_cache.num_cpu_cached_blocks == 0
    assert events and all(getattr(e, "medium", "GPU") == "GPU" for e in events)
