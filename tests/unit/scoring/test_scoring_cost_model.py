"""The TTFT cost model: each term, and the break-even that decides replication of a hot prefix."""

from __future__ import annotations

import pytest
from scoring_helpers import endpoint, request

from kvgate.scoring.base import EngineLoad
from kvgate.scoring.cost_model import CostModel, CostModelParams

RATE = 10_000.0


def model(**kw: float) -> CostModel:
    return CostModel(CostModelParams(prior_prefill_tokens_per_second=RATE, **kw))


def test_cold_idle_pod_costs_the_full_prefill() -> None:
    est = model().estimate(request(4096), endpoint(0), 0)
    assert est.hit_tokens == 0
    assert est.uncached_tokens == 4096
    assert est.queue_seconds == 0.0
    assert est.prefill_seconds == pytest.approx(4096 / RATE)
    assert est.ttft_seconds == pytest.approx(4096 / RATE)


def test_hit_is_whole_blocks_and_never_the_last_token() -> None:
    m = model()
    # 4096 tokens = 256 blocks; vLLM recomputes at least the last token -> at most 255 blocks.
    assert m.hit_tokens(request(4096), 256) == 255 * 16
    assert m.hit_tokens(request(4096), 10) == 160
    assert m.hit_tokens(request(4100), 1000) == 256 * 16
    assert m.hit_tokens(request(1), 5) == 0
    assert m.hit_tokens(request(4096), 0) == 0


def test_approximate_keys_are_discounted() -> None:
    m = model(approximate_hit_discount=0.5)
    assert m.hit_tokens(request(4096, keys_exact=False), 100) == 800
    assert m.hit_tokens(request(4096, keys_exact=True), 100) == 1600


def test_pending_prefill_tokens_queue_ahead() -> None:
    est = model().estimate(request(1000), endpoint(0, pending_prefill_tokens=20_000), 0)
    assert est.queue_seconds == pytest.approx(2.0)
    assert est.ttft_seconds == pytest.approx(2.1)


def test_learned_rate_replaces_prior() -> None:
    ep = endpoint(0, prefill_tokens_per_second=20_000.0, pending_prefill_tokens=20_000)
    est = model().estimate(request(2000), ep, 0)
    assert est.queue_seconds == pytest.approx(1.0)
    assert est.prefill_seconds == pytest.approx(0.1)


def test_unmeasured_pod_gets_the_mean_rate_of_its_measured_pool_peers() -> None:
    eps = [
        endpoint(0, prefill_tokens_per_second=29_000.0),
        endpoint(1, prefill_tokens_per_second=30_000.0),
        endpoint(2, prefill_tokens_per_second=31_000.0),
        endpoint(3),  # fresh: nothing learned yet
        endpoint(4, pool="pool-b"),  # no measured peer in its pool
    ]
    est = model().estimate_all(request(3000), eps, {})
    assert est["pod-3"].prefill_tokens_per_second == pytest.approx(30_000.0)
    assert est["pod-3"].prefill_seconds == pytest.approx(0.1)
    assert est["pod-0"].prefill_tokens_per_second == pytest.approx(29_000.0)
    assert est["pod-4"].prefill_tokens_per_second == pytest.approx(RATE)


def test_prior_applies_while_no_pod_is_measured() -> None:
    est = model().estimate_all(request(3000), [endpoint(0), endpoint(1)], {})
    assert {e.prefill_tokens_per_second for e in est.values()} == {RATE}


def test_foreign_waiting_requests_count_beyond_our_own() -> None:
    eng = EngineLoad(waiting=5, running=0, kv_cache_usage=0.1)
    ep = endpoint(0, engine=eng, pending_prefill_requests=2, pending_prefill_tokens=4000)
    est = model(foreign_request_tokens=1000).estimate(request(16), ep, 0)
    # our 4000 pending tokens + 3 foreign waiting requests x 1000 tokens
    assert est.queue_seconds == pytest.approx(7000 / RATE)
    assert est.load == 5


def test_waiting_requests_are_ours_as_counted_when_scraped() -> None:
    # Scraped while 2 of ours waited; both have had their first token since: the engine's 2
    # waiting were ours, not 2 foreign ones.
    eng = EngineLoad(waiting=2, running=0, kv_cache_usage=0.1, pending_at_scrape=2)
    ep = endpoint(0, engine=eng, pending_prefill_requests=0)
    est = model(foreign_request_tokens=1000).estimate(request(16), ep, 0)
    assert est.queue_seconds == 0.0
    # One of ours waited then, 3 of the engine's waiting were foreign; 2 of ours sent since
    eng = EngineLoad(waiting=4, running=0, kv_cache_usage=0.1, pending_at_scrape=1)
    ep = endpoint(0, engine=eng, pending_prefill_requests=2, pending_prefill_tokens=4000)
    est = model(foreign_request_tokens=1000).estimate(request(16), ep, 0)
    assert est.queue_seconds == pytest.approx(7000 / RATE)


def test_a_pod_without_a_fresh_engine_report_is_priced_on_the_routers_own_counts() -> None:
    eng = EngineLoad(waiting=50, running=100, kv_cache_usage=0.99)
    reported = model().estimate(request(1000), endpoint(0, engine=eng, in_flight=3), 0)
    unknown = model().estimate(request(1000), endpoint(0, in_flight=3), 0)
    assert reported.queue_seconds > 1.0 and reported.load == 150
    assert unknown.queue_seconds == 0.0 and unknown.load == 3
    assert unknown.prefill_seconds == pytest.approx(0.1)


def test_running_decodes_slow_prefill() -> None:
    eng = EngineLoad(waiting=0, running=4096, kv_cache_usage=0.1)
    est = model(max_num_batched_tokens=8192).estimate(
        request(1000), endpoint(0, engine=eng), 0, 0.0
    )
    assert est.prefill_tokens_per_second == pytest.approx(RATE / 2)
    assert est.prefill_seconds == pytest.approx(0.2)


def test_full_batch_adds_slot_wait() -> None:
    eng = EngineLoad(waiting=2, running=8, kv_cache_usage=0.1)
    ep = endpoint(0, engine=eng, max_num_seqs=8)
    est = model(slot_wait_seconds=0.5, foreign_request_tokens=0).estimate(request(16), ep, 0)
    # running 8 + 2 queued + this one = 11 > 8 -> 3 slots to wait for
    assert est.queue_seconds == pytest.approx(1.5)


def test_kv_pressure_penalty_above_threshold() -> None:
    def queue(usage: float) -> float:
        eng = EngineLoad(waiting=0, running=0, kv_cache_usage=usage)
        m = model(kv_pressure_threshold=0.8, kv_pressure_seconds=2.0)
        return m.estimate(request(16), endpoint(0, engine=eng), 0).queue_seconds

    assert queue(0.5) == 0.0
    assert queue(0.9) == pytest.approx(1.0)
    assert queue(1.0) == pytest.approx(2.0)


def test_holder_wins_until_its_extra_queue_exceeds_the_hit_prefill_time() -> None:
    """A holder of H tokens beats an idle pod until queue > H / rate: the replication rule."""
    m = model()
    req = request(8192)
    hit_blocks = 256  # 4096 tokens held
    idle = m.estimate(req, endpoint(1), 0).ttft_seconds
    below = m.estimate(req, endpoint(0, pending_prefill_tokens=4000), hit_blocks)
    above = m.estimate(req, endpoint(0, pending_prefill_tokens=4200), hit_blocks)
    assert below.ttft_seconds < idle < above.ttft_seconds


def test_a_cpu_tier_hit_costs_its_copy_back_less_than_recompute_more_than_gpu() -> None:
    m = model(cpu_load_tokens_per_second=40 * RATE)
    pods = [endpoint(0), endpoint(1), endpoint(2)]
    # pod-0 holds 200 blocks on the GPU; pod-1 the same 200, 50 on the GPU and 150 in CPU memory;
    # pod-2 nothing.
    req = request(4096, gpu_matched_blocks={"pod-0": 200, "pod-1": 50})
    est = m.estimate_all(req, pods, {"pod-0": 200, "pod-1": 200})
    gpu, tiered, cold = est["pod-0"], est["pod-1"], est["pod-2"]
    assert gpu.hit_tokens == tiered.hit_tokens == 3200 and tiered.cpu_hit_tokens == 2400
    assert gpu.cpu_hit_tokens == 0 and gpu.prefill_seconds == pytest.approx(896 / RATE)
    assert tiered.prefill_seconds == pytest.approx(896 / RATE + 2400 / (40 * RATE))
    assert gpu.ttft_seconds < tiered.ttft_seconds < cold.ttft_seconds
    # Without a tier (gpu_matched_blocks None) the same match is all on the GPU.
    plain = m.estimate_all(request(4096), pods, {"pod-1": 200})["pod-1"]
    assert plain.cpu_hit_tokens == 0 and plain.prefill_seconds == gpu.prefill_seconds


def test_a_pod_without_the_requests_lora_adapter_pays_to_load_it() -> None:
    m = model(lora_load_seconds=0.2, lora_slot_wait_seconds=1.0)

    def queue(adapter: str | None, running: set[str], waiting: set[str], max_lora: int) -> float:
        engine = EngineLoad(0, len(running), 0.0, frozenset(running), frozenset(waiting), max_lora)
        ep = endpoint(0, engine=engine)
        return m.estimate(request(1024, lora_adapter=adapter), ep, 0).queue_seconds

    assert queue("sql", {"sql"}, set(), 2) == 0.0  # running there: loaded
    assert queue("sql", set(), {"sql"}, 2) == 0.0  # queued there, a slot is free
    assert queue("sql", {"chat"}, set(), 2) == pytest.approx(0.2)  # a free slot: load only
    assert queue("sql", {"chat", "code"}, set(), 2) == pytest.approx(1.2)  # every slot taken
    assert queue("sql", {"chat", "code"}, {"sql"}, 2) == pytest.approx(1.0)  # waits behind its own
    assert queue(None, {"chat", "code"}, set(), 2) == 0.0  # base-model requests are not slotted
    assert queue("sql", set(), set(), 0) == 0.0  # the pod reports no LoRA serving: unknown


def test_an_adapter_the_pod_used_last_is_taken_as_still_loaded() -> None:
    from kvgate.discovery.endpoints import Endpoint, EndpointSpec, LoadSample

    ep = Endpoint(EndpointSpec(id="p", pool="ns/p", url="http://p"), LoadSample(max_lora=2))
    ep.note_lora_adapters(["sql", "chat"])
    ep.note_lora_adapters(["sql"])
    ep.note_lora_adapters(["code"])  # two GPU slots: chat, the least recently used, is out
    assert ep.recent_lora_adapters == {"sql", "code"}
    m = model(lora_load_seconds=0.2)
    engine = EngineLoad(0, 0, 0.0, frozenset(), frozenset(), 2, ep.recent_lora_adapters)
    snapshot = endpoint(0, engine=engine)
    warm = m.estimate(request(1024, lora_adapter="sql"), snapshot, 0)
    cold = m.estimate(request(1024, lora_adapter="chat"), snapshot, 0)
    assert warm.queue_seconds == 0.0 and cold.queue_seconds == pytest.approx(0.2)


def test_a_pod_keeps_at_most_max_lora_recent_adapters_however_many_it_names() -> None:
    from kvgate.discovery.endpoints import Endpoint, EndpointSpec, LoadSample

    ep = Endpoint(EndpointSpec(id="p", pool="ns/p", url="http://p"), LoadSample(max_lora=1024))
    for scrape in range(20):
        ep.note_lora_adapters(f"{scrape}-{i}" for i in range(1024))
    assert ep.recent_lora_adapters == {f"19-{i}" for i in range(1024)}
    ep.note_lora_adapters(["19-0"])  # named again: now the most recent, kept longest
    ep.note_lora_adapters(["new"])
    assert "19-0" in ep.recent_lora_adapters and "19-1" not in ep.recent_lora_adapters
    assert len(ep.recent_lora_adapters) == 1024


def test_decode_is_priced_by_the_kv_the_pods_requests_hold() -> None:
    m = model(decode_seconds_per_kv_token=1e-8)
    engine = EngineLoad(waiting=0, running=4, kv_cache_usage=0.5, kv_capacity_tokens=200_000)
    ep = endpoint(0, engine=engine, pending_prefill_tokens=20_000)
    est = m.estimate(request(1000, expected_output_tokens=500.0), ep, 0)
    # 500 steps, each reading the 100k active tokens and the 20k sent that have not started
    assert est.decode_seconds == pytest.approx(500 * 1e-8 * 120_000)
    assert est.ttft_seconds == pytest.approx(est.queue_seconds + est.prefill_seconds)


def test_no_decode_price_without_an_output_expectation_or_a_cache_size() -> None:
    m = model()
    sized = EngineLoad(waiting=0, running=4, kv_cache_usage=0.5, kv_capacity_tokens=200_000)
    unsized = EngineLoad(waiting=0, running=4, kv_cache_usage=0.5)
    assert m.estimate(request(1000), endpoint(0, engine=sized), 0).decode_seconds == 0.0
    long = request(1000, expected_output_tokens=500.0)
    assert m.estimate(long, endpoint(0, engine=unsized), 0).decode_seconds == 0.0
    assert m.estimate(long, endpoint(0), 0).decode_seconds == 0.0
