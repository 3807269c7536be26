"""The hit-rate bounds: one infinite cache and one fleet-sized LRU cache, on traces worked by hand."""

import math
import random

import pytest

from kvgate.bench.fleet import parse_num_gpu_blocks
from kvgate.bench.hit_bounds import fleet_kv_blocks, hit_rate_bounds
from kvgate.bench.report import BenchReport, finite_hit_rate, ideal_hit_rate, markdown_table
from kvgate.bench.workload import completion_request

BS = 2  # tokens per block: every prompt below is a few blocks


def req(rid: str, tokens: list[int]):  # type: ignore[no-untyped-def]
    return completion_request(rid, tokens, 1, 0)


# Five-token prompts: two full blocks, both cacheable (the fifth token is always recomputed).
A = [1, 2, 3, 4, 99]
B = [5, 6, 7, 8, 99]
C = [10, 11, 12, 13, 99]


def test_lru_evicts_the_least_recently_used_prefix() -> None:
    trace = [req(str(i), t) for i, t in enumerate([A, B, A, C, A, B])]
    # capacity 4 blocks = two prompts. A, B: cold. A: hit (2 blocks), A is now most recent.
    # C evicts B (least recent). A: hit. B: miss (evicted), and evicts C.
    bounds = hit_rate_bounds(trace, BS, capacity_blocks=4)
    assert bounds.finite == pytest.approx(4 * BS / 30)
    # the infinite cache also hits B's second visit
    assert bounds.ideal == pytest.approx(6 * BS / 30)
    assert finite_hit_rate(trace, 4, BS) == bounds.finite
    assert ideal_hit_rate(trace, BS) == bounds.ideal


def test_a_prefix_loses_its_tail_before_its_head() -> None:
    # Three blocks of room: after A and B, one block must go. A's blocks were touched last
    # block first, so A's tail is the least recent and A keeps its first block.
    a, b = [1, 2, 3, 4, 99], [5, 6, 7, 8, 99]
    trace = [req("a", a), req("b", b), req("a2", a)]
    assert hit_rate_bounds(trace, BS, capacity_blocks=3).finite == pytest.approx(1 * BS / 15)
    assert hit_rate_bounds(trace, BS, capacity_blocks=2).finite == 0.0  # A is gone entirely
    assert hit_rate_bounds(trace, BS, capacity_blocks=4).finite == pytest.approx(2 * BS / 15)


def test_the_last_prompt_token_is_always_recomputed() -> None:
    exact = [1, 2, 3, 4]  # two full blocks and nothing after: only the first can hit
    bounds = hit_rate_bounds([req("a", exact), req("b", exact)], BS, capacity_blocks=100)
    assert bounds.finite == bounds.ideal == pytest.approx(1 * BS / 8)
    # a partial last block is never cached: [1, 2, 3] has one full block
    bounds = hit_rate_bounds([req("a", [1, 2, 3]), req("b", [1, 2, 3])], BS, capacity_blocks=100)
    assert bounds.finite == pytest.approx(BS / 6)


def test_a_cache_larger_than_the_working_set_reaches_the_ideal() -> None:
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(40)] for _ in range(5)]
    trace = [
        req(str(i), rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(9))])
        for i in range(200)
    ]
    big = hit_rate_bounds(trace, 4, capacity_blocks=10_000)
    assert big.finite == pytest.approx(big.ideal) and big.ideal > 0.5
    small = hit_rate_bounds(trace, 4, capacity_blocks=15)  # 1.5 prefixes of room
    assert 0 < small.finite < big.finite
    assert hit_rate_bounds(trace, 4, capacity_blocks=0).finite == 0.0


def test_without_a_capacity_only_the_ideal_is_known() -> None:
    bounds = hit_rate_bounds([req("a", A), req("b", A)], BS)
    assert bounds.ideal == pytest.approx(4 / 10) and math.isnan(bounds.finite)
    assert bounds.capacity_blocks is None
    empty = hit_rate_bounds([], BS, capacity_blocks=4)
    assert math.isnan(empty.ideal) and math.isnan(empty.finite)


def test_fleet_capacity_is_pods_times_usable_blocks() -> None:
    assert fleet_kv_blocks(8, 24_626) == 8 * 24_625  # block 0 is vLLM's null block
    assert fleet_kv_blocks(0, 100) == 0


def test_num_gpu_blocks_is_read_from_cache_config_info() -> None:
    page = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_cpu_blocks="None",'
        'num_gpu_blocks="24626",num_gpu_blocks_override="None"} 1.0\n'
        'vllm:num_requests_running{model_name="m"} 0.0\n'
    )
    assert parse_num_gpu_blocks(page) == 24_626
    assert parse_num_gpu_blocks('vllm:num_requests_running{model_name="m"} 0.0\n') is None


def test_report_carries_the_finite_bound_beside_the_ideal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = BenchReport("w", "desc", 8, 0.23, {}, finite_hit_rate=0.13, kv_capacity_blocks=197_000)
    data = report.to_json()
    assert (data["ideal_hit_rate"], data["finite_hit_rate"]) == (0.23, 0.13)
    assert data["kv_capacity_blocks"] == 197_000
    assert "hit rate (ideal 0.23, finite 0.13)" in markdown_table(report)
    unknown = BenchReport("w", "desc", 8, 0.23, {})
    assert unknown.to_json()["finite_hit_rate"] is None
    assert "finite n/a" in markdown_table(unknown)
