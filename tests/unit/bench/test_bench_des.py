"""Discrete-event mode: kvgate's policies on simulated engines, in simulated time."""

import asyncio
import itertools
import json
from collections import Counter

import pytest

from kvgate.bench.des import des_report, run_des
from kvgate.bench.des_driver import RouterDriver
from kvgate.bench.mooncake import TraceParams, build_trace_workload, read_trace
from kvgate.bench.report import markdown_table, summarize
from kvgate.bench.workloads import build_workload
from kvgate.sim.des import DESFleet
from kvgate.sim.engine import EngineConfig
from kvgate.sim.profile import DEFAULT_PROFILE, load_profile

PARAMS = {
    "num_groups": "4",
    "prompts_per_group": "6",
    "system_prompt_len": "512",
    "question_len": "32",
    "output_len": "8",
    "rate_rps": "50",
}


def test_every_request_completes_with_engine_times_and_usage():
    w = build_workload("shared-prefix", PARAMS)
    result = run_des(w, "round-robin", 3)
    assert len(result.records) == 24
    for r in result.records:
        assert r.ok and r.endpoint in {"pod-0", "pod-1", "pod-2"}
        assert r.sent_s <= r.first_byte_s <= r.end_s
        assert r.prompt_tokens == 544 and r.completion_tokens == 8
        assert r.cached_tokens % 16 == 0
    assert summarize("rr", result.records).pods_used == {"pod-0": 8, "pod-1": 8, "pod-2": 8}
    assert result.samples and {s.pod for s in result.samples} == {"pod-0", "pod-1", "pod-2"}


def test_prefix_aware_policies_hit_more_than_round_robin_and_runs_are_deterministic():
    w = build_workload("shared-prefix", PARAMS)
    report, _records, _ = des_report(w, 4, ["round-robin", "kvgate", "sglang-cache-aware"])
    rr, kv = report.targets["round-robin"], report.targets["kvgate"]
    assert kv.hit_rate > rr.hit_rate
    assert kv.hit_rate <= report.ideal_hit_rate + 1e-9
    assert "sglang-cache-aware" in report.notes[0]
    again, _, _ = des_report(w, 4, ["kvgate"])
    assert again.targets["kvgate"].ttft_mean_s == pytest.approx(kv.ttft_mean_s)
    # where the decode time went, per target, in report.json and report.md
    for summary in (rr, kv):
        assert summary.engine["preemptions"] == 0
        assert summary.engine["decodes_per_prefill_step"] > 0
        assert 0 < summary.engine["prefill_step_share"] < 1
    assert "kvgate engines:" in markdown_table(report)


def test_sessions_wait_for_their_previous_turn():
    w = build_workload(
        "agent-sessions", {"num_sessions": "3", "max_turns": "3", "max_output_len": "4"}
    )
    result = run_des(w, "kvgate", 2)
    by_session: dict[str, list] = {}
    for r in result.records:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: r.sent_s)
        for earlier, later in itertools.pairwise(turns):
            assert later.sent_s >= earlier.end_s


def test_a_trace_without_timestamps_replays_each_session_turn_after_turn():
    rows = read_trace(
        f'{{"session_id": "s{n % 3}", "input_length": {600 + 100 * n}, "output_length": 6,'
        f' "hash_ids": [{n % 3}, {10 + n}], "delay": 40}}'
        for n in range(9)
    )
    result = run_des(build_trace_workload(rows, TraceParams()), "kvgate", 2)
    assert len(result.records) == 9 and all(r.ok for r in result.records)
    by_session: dict[str | None, list] = {}
    for r in result.records:
        by_session.setdefault(r.session_id, []).append(r)
    assert set(by_session) == {"s0", "s1", "s2"}
    for turns in by_session.values():
        turns.sort(key=lambda r: r.sent_s)
        for earlier, later in itertools.pairwise(turns):
            assert later.sent_s >= earlier.end_s + 0.04 - 1e-9


def test_a_session_ends_at_a_refused_turn_and_the_report_counts_what_was_not_sent():
    """As a live agent whose call failed stops; the turns after it were counted nowhere."""
    lengths = {"s0": [600, 200_000, 700], "s1": [600, 650, 700]}  # 200k: over max_model_len
    rows = read_trace(
        f'{{"session_id": "{s}", "input_length": {n}, "output_length": 4, "hash_ids": [{i}]}}'
        for i, (s, turns) in enumerate(lengths.items())
        for n in turns
    )
    report, records, _ = des_report(build_trace_workload(rows, TraceParams()), 2, ["kvgate"])
    assert sorted((r.session_id, r.status) for r in records["kvgate"]) == [
        ("s0", 200), ("s0", 400), ("s1", 200), ("s1", 200), ("s1", 200)
    ]  # fmt: skip
    assert report.notes == [
        "kvgate: 1 of 6 requests not sent (a session ends at its first failed turn)"
    ]


def test_a_trace_of_chats_is_tokenized_and_its_later_turns_hit_the_cache():
    """Rows that carry their prompt (aiperf's `messages`): each turn reaches the pods as the
    simulator tokenizes it, and a later turn of a session reuses its earlier turns' blocks."""
    system = {"role": "system", "content": "You are a careful coding agent. " * 40}
    history = [system, {"role": "user", "content": "fix the failing test"}]
    rows = []
    for turn in range(4):
        rows.append(
            json.dumps({"session_id": "s", "messages": history, "output_length": 4, "delay": 10})
        )
        history = [
            *history,
            {"role": "assistant", "content": f"step {turn}: ran the tests " * 8},
            {"role": "user", "content": f"output {turn} " * 30},
        ]
    result = run_des(build_trace_workload(read_trace(rows), TraceParams()), "kvgate", 2)
    assert len(result.records) == 4 and all(r.ok for r in result.records)
    later = sorted(result.records, key=lambda r: r.sent_s)[1:]
    assert all(r.cached_tokens and r.cached_tokens > 0.5 * r.prompt_tokens for r in later)


def test_the_kv_event_directory_matches_the_engines_caches():
    """The router's directory, fed by the engines' KV events through the indexer's subscriber
    code, says exactly what each engine's prefix cache holds."""
    w = build_workload("shared-prefix", PARAMS)
    fleet = DESFleet(3, EngineConfig(), load_profile(DEFAULT_PROFILE))
    driver = RouterDriver(fleet, "prefix")
    try:
        fleet.run(driver.trace(w), driver)
        matched_any = False
        for request in w.requests:
            keys = fleet.hasher.prompt_hashes(list(request.prefix_units), None)
            expected = {
                fleet.names[i]: n
                for i, engine in enumerate(fleet.engines)
                if (n := engine.kv_cache.cached_prefix_blocks(keys))
            }
            found = asyncio.run(driver.index.lookup(keys))
            assert found == expected
            matched_any = matched_any or bool(found)
        assert matched_any
    finally:
        driver.close()


def test_decisions_are_the_routing_cores_and_deterministic():
    w = build_workload("shared-prefix", PARAMS)
    first = run_des(w, "kvgate", 3)
    again = run_des(w, "kvgate", 3)
    assert first.decisions == again.decisions
    assert len(first.decisions) == 24
    reasons = {reason for _rid, _ep, reason, _hit in first.decisions}
    assert "prefix-hit" in reasons
    assert any(hit > 0 for *_rest, hit in first.decisions)


def test_replicas_route_one_workload_over_one_directory_and_exchange_their_loads():
    from kvgate.api.fleet import LoadSharingConfig

    w = build_workload("shared-prefix", PARAMS)
    fleet = DESFleet(3, EngineConfig(), load_profile(DEFAULT_PROFILE))
    driver = RouterDriver(fleet, "kvgate", replicas=3, load_sharing=LoadSharingConfig())
    try:
        fleet.run(driver.trace(w), driver)
    finally:
        driver.close()
    assert len(driver.records) == 24 and all(r.ok for r in driver.records)
    answered = [
        sum(
            sample.value
            for metric in replica.core.metrics.registry.collect()
            if metric.name == "kvgate_router_requests"
            for sample in metric.samples
            if sample.name == "kvgate_router_requests_total"
        )
        for replica in driver.replicas
    ]
    assert sum(answered) == 24 and all(answered)  # every replica routed some of them
    assert all(r.core.peers.replicas == 2 for r in driver.replicas)
    assert driver.tick_interval_s == LoadSharingConfig().interval_seconds
    # Hits come from the one directory every replica reads.
    assert sum(r.cached_tokens for r in driver.records) > 0


def test_replicas_told_not_to_share_load_count_only_their_own():
    from kvgate.api.fleet import LoadSharingConfig

    fleet = DESFleet(3, EngineConfig(), load_profile(DEFAULT_PROFILE))
    off = LoadSharingConfig(enabled=False, interval_seconds=0.001)
    driver = RouterDriver(fleet, "kvgate", replicas=2, load_sharing=off)
    try:
        scrape = driver.config.load_metrics.scrape_interval_seconds
        assert driver.tick_interval_s == scrape  # no exchange ticks between the scrapes
    finally:
        driver.close()


def test_a_scale_up_warms_the_new_pods_before_they_take_requests():
    from kvgate.api.fleet import WarmupConfig

    w = build_workload("shared-prefix", {**PARAMS, "prompts_per_group": "30", "rate_rps": "20"})
    result = run_des(w, "kvgate", 2, scale=[(3.0, 1)], warmup=WarmupConfig(ramp_seconds=0.5))
    assert all(r.ok for r in result.records)
    on_new = [r for r in result.records if r.endpoint == "pod-2"]
    assert on_new and min(r.sent_s for r in on_new) >= 3.0
    # warmed: the new pod's first request already hits a system prompt
    first = min(on_new, key=lambda r: r.sent_s)
    assert first.cached_tokens >= 512


def test_online_traffic_leaves_the_pods_batch_work_borrowed():
    # Online chat and batch documents on one online pool of 4 pods at ~75% load: the batch
    # requests borrow pods with room; with class isolation the online requests gather on the
    # pods without batch work, so fewer of them wait behind a document's prefill, and the
    # pods left to batch stay borrowable.
    w = build_workload("mixed", {"duration_s": 20, "online_rate_rps": 26, "batch_rate_rps": 4.5})

    def ttfts(policy_params: dict[str, object] | None) -> tuple[float, float]:
        records = run_des(w, "kvgate", 4, policy_params=policy_params).records
        assert all(r.ok for r in records)
        online = sorted(r.ttft_s or 0.0 for r in records if r.request_class == "online")
        batch = [r.ttft_s or 0.0 for r in records if r.request_class == "batch"]
        return online[int(len(online) * 0.99)], sum(batch) / len(batch)

    isolated_p99, isolated_batch = ttfts(None)
    mixed_p99, mixed_batch = ttfts({"class_isolation": None})
    assert isolated_p99 < 0.5 * mixed_p99
    assert isolated_batch < mixed_batch


def test_online_traffic_yields_a_pod_to_batch_requests_waiting_to_borrow_one():
    # Past capacity (about 130% of round robin's): the online prefix groups start on two pods,
    # batch requests queue in the router for a pod under the borrowing limits. With the yield
    # the online traffic leaves the lighter of its pods, which batch then borrows.
    w = build_workload(
        "mixed", {"seed": 0, "duration_s": 20, "online_rate_rps": 47, "batch_rate_rps": 7.8}
    )

    def run(yield_to_batch: bool) -> tuple[float, float]:
        params = {"class_isolation": {"yield_to_batch": yield_to_batch}}
        records = run_des(w, "kvgate", 4, policy_params=params).records
        assert all(r.ok for r in records)
        batch = [r.ttft_s or 0.0 for r in records if r.request_class == "batch"]
        online = Counter(r.endpoint for r in records if r.request_class == "online")
        return sum(batch) / len(batch), max(online.values()) / sum(online.values())

    yielded_batch, yielded_share = run(True)
    apart_batch, apart_share = run(False)
    assert yielded_batch < 0.6 * apart_batch
    assert yielded_share > 0.85 > 0.7 > apart_share


@pytest.mark.parametrize("shared", [None, False], ids=["shared-by-default", "each-on-its-own"])
def test_replicas_warm_a_new_pod_once_when_they_share_warm_ups(shared):
    from kvgate.api.fleet import LoadSharingConfig, WarmupConfig

    w = build_workload("shared-prefix", {**PARAMS, "prompts_per_group": "60", "rate_rps": "20"})
    warmup = WarmupConfig(ramp_seconds=0.5, shared=shared)  # hot counts shared every 5 s
    sets = {}
    for replicas in (1, 3):
        result = run_des(
            w,
            "kvgate",
            2,
            scale=[(8.0, 1)],
            warmup=warmup,
            replicas=replicas,
            load_sharing=LoadSharingConfig(),
        )
        assert all(r.ok for r in result.records)
        on_new = [r for r in result.records if r.endpoint == "pod-2"]
        assert on_new and min(r.sent_s for r in on_new) >= 8.0
        assert min(on_new, key=lambda r: r.sent_s).cached_tokens >= 512  # warmed first
        sets[replicas] = result.warm_requests
    # The 4 system prompts: one router warms the new pod with the 4; sharing, one claimant
    # sends the 4; on their own, each replica sends those it saw at least twice.
    assert sets[1] == 4
    assert (sets[3] == 4) if shared is None else (sets[3] > 4)
