"""Behaviour of the built-in policies: what a user of the router would notice."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter

import pytest
from scoring_helpers import endpoint, fleet, random_case, request

from kvgate.scoring.base import ChoiceHistory, EndpointSnapshot, NoEligibleEndpointError
from kvgate.scoring.registry import build_policy, default_registry

RATE = 10_000.0  # the default prior prefill rate, tokens/s


def decide(policy_name: str, req, eps, matched, *, seed=0, history=None, params=None):  # type: ignore[no-untyped-def]
    policy = build_policy(policy_name, params or {})
    return policy.decide(
        req, eps, matched, now=0.0, rng=random.Random(seed), history=history or ChoiceHistory()
    )


@pytest.mark.parametrize("name", default_registry().names("policy"))
def test_every_policy_is_pure_and_deterministic_for_a_seed(name: str) -> None:
    policy = build_policy(name)
    rng = random.Random(name)
    for _ in range(100):
        req, eps, matched, now = random_case(rng)
        history = ChoiceHistory()
        for e in eps[::2]:
            history.record(e.id)
        before = (copy.deepcopy(eps), dict(matched), len(history), history.last_chosen("pod-0"))
        try:
            a = policy.decide(req, eps, matched, now=now, rng=random.Random(3), history=history)
        except NoEligibleEndpointError:
            assert all(not e.healthy or e.draining for e in eps)
            continue
        b = policy.decide(req, eps, matched, now=now, rng=random.Random(3), history=history)
        assert a == b
        assert (eps, matched, len(history), history.last_chosen("pod-0")) == before
        chosen = next(e for e in eps if e.id == a.endpoint_id)
        assert chosen.healthy and not chosen.draining
        assert {c.estimate.endpoint_id for c in a.candidates} == {e.id for e in eps}
        for c in a.candidates:
            assert (c.total_score is None) == (c.dropped_by is not None)
            assert c.total_score is None or 0.0 <= c.total_score <= 1.0
        json.dumps(a.to_dict())


def test_no_endpoints_or_none_healthy_raises() -> None:
    with pytest.raises(NoEligibleEndpointError):
        decide("kvgate", request(), [], {})
    with pytest.raises(NoEligibleEndpointError):
        decide("kvgate", request(), [endpoint(0, healthy=False), endpoint(1, draining=True)], {})


def test_multi_turn_session_stays_on_its_holder() -> None:
    policy = build_policy("kvgate")
    eps = fleet(4)
    history, rng = ChoiceHistory(), random.Random(1)
    holder, held_blocks = None, 0
    for turn in range(8):
        prompt = 2000 + turn * 1500  # the history grows each turn
        matched = {holder: held_blocks} if holder else {}
        d = policy.decide(request(prompt), eps, matched, now=0.0, rng=rng, history=history)
        history.record(d.endpoint_id)
        if holder is None:
            assert d.reason == "no-hit-spread"
            holder = d.endpoint_id
        else:
            assert d.endpoint_id == holder, f"turn {turn} left the holder"
            assert d.reason == "prefix-hit"
            assert d.predicted_hit_tokens == held_blocks * 16
        held_blocks = prompt // 16


def test_session_moves_when_another_pod_is_faster() -> None:
    # pod-0 holds 4096 of 8192 tokens: 0.41 s of prefill. With the default work_weight 1 the
    # holder keeps the session until its queue exceeds (1 + 1) x 0.41 s = 8192 pending tokens.
    req = request(8192)
    matched = {"pod-0": 256}
    stay = [endpoint(0, pending_prefill_tokens=5000), endpoint(1), endpoint(2)]
    d = decide("kvgate", req, stay, matched)
    assert (d.endpoint_id, d.reason) == ("pod-0", "prefix-hit")
    move = [endpoint(0, pending_prefill_tokens=9500), endpoint(1), endpoint(2)]
    d = decide("kvgate", req, move, matched)
    assert d.endpoint_id in {"pod-1", "pod-2"}
    assert d.reason == "load-spill"
    assert d.predicted_hit_tokens == 0
    # Greedy per-request TTFT (work_weight 0) moves as soon as the holder's queue > 0.41 s.
    greedy = decide("kvgate", req, stay, matched, params={"work_weight": 0, "tolerance": 0})
    assert greedy.endpoint_id != "pod-0"
    holder = next(c for c in greedy.candidates if c.estimate.endpoint_id == "pod-0")
    assert holder.estimate.ttft_seconds > greedy.predicted_ttft_seconds


def test_kvgate_pending_weight_keeps_a_cold_prefill_off_pods_with_first_tokens_due() -> None:
    # pod-0 runs fewer requests, but three of them await their first token, and the 12k-token
    # prefill would share a step with them. Unpriced, fewest requests picks pod-0.
    eps = [endpoint(0, in_flight=3, pending_prefill_requests=3), endpoint(1, in_flight=5)]
    priced = decide("kvgate", request(12_000), eps, {})
    assert priced.endpoint_id == "pod-1"
    lines = {c["endpoint"]: c for c in priced.to_dict()["candidates"]}  # /debug/route
    assert (lines["pod-0"]["first_tokens_due"], lines["pod-1"]["first_tokens_due"]) == (3, 0)
    assert lines["pod-0"]["scores"]["predicted-ttft"] < 1.0 == lines["pod-1"]["total_score"]
    unpriced = decide("kvgate", request(12_000), eps, {}, params={"pending_weight": 0})
    assert unpriced.endpoint_id == "pod-0"
    # the first chunk is the cost model's step budget
    small = {"cost_model": {"max_num_batched_tokens": 256}}
    assert decide("kvgate", request(12_000), eps, {}, params=small).endpoint_id == "pod-0"


def test_kvgate_moves_online_requests_off_a_holder_that_batch_work_borrowed() -> None:
    # pod-0 holds the prompt's first 4,096 tokens and also decodes a borrowed batch document.
    # A 4,160-token turn stays: recomputing it on pod-1 would cost ~0.4 s more, over the
    # 0.25 s a move may cost. A 1,088-token chat turn (~0.1 s to recompute) moves: its prefix's
    # later requests then hit on pod-1, which batch work did not borrow.
    eps = [endpoint(0, in_flight=3, batch_in_flight=1), endpoint(1, in_flight=2)]
    stay = decide("kvgate", request(4160), eps, {"pod-0": 256})
    assert (stay.endpoint_id, stay.reason) == ("pod-0", "prefix-hit")
    move = decide("kvgate", request(1088), eps, {"pod-0": 64})
    assert (move.endpoint_id, move.reason) == ("pod-1", "class-isolation")
    # Batch requests are not moved, and the filter can be turned off.
    batch = decide("kvgate", request(1088, request_class="batch"), eps, {"pod-0": 64})
    assert batch.endpoint_id == "pod-0"
    off = decide("kvgate", request(1088), eps, {"pod-0": 64}, params={"class_isolation": None})
    assert off.endpoint_id == "pod-0"


def test_affinity_cap_moves_a_request_only_to_a_pod_that_answers_sooner() -> None:
    req = request(100_000)  # 96k tokens held by pod-0; recomputing them elsewhere takes 10 s
    matched = {"pod-0": 6000}
    # The holder's queue is 12 s: a first token in 12.4 s there, 10 s on pod-1. Cheaper for the
    # fleet on the holder (no recompute), so only the cap moves the request.
    eps = [endpoint(0, pending_prefill_tokens=120_000), endpoint(1)]
    assert (
        decide("kvgate", req, eps, matched, params={"max_affinity_wait_seconds": 15}).endpoint_id
        == "pod-0"
    )
    d = decide("kvgate", req, eps, matched, params={"max_affinity_wait_seconds": 5})
    assert (d.endpoint_id, d.reason) == ("pod-1", "affinity-cap")
    dropped = {c.estimate.endpoint_id: c.dropped_by for c in d.candidates}
    assert dropped == {"pod-0": "affinity-cap", "pod-1": None}
    # A 2.5 s queue over a 2 s cap: the holder still answers first (2.9 s against 10 s), and a
    # move would recompute the whole prefix, so the request stays.
    eps = [endpoint(0, pending_prefill_tokens=25_000), endpoint(1)]
    d = decide("kvgate", req, eps, matched, params={"max_affinity_wait_seconds": 2})
    assert (d.endpoint_id, d.reason) == ("pod-0", "prefix-hit")


def test_load_bound_moves_off_an_overloaded_holder() -> None:
    # pod-0 holds the prefix and has no prefill queued, but 40 requests decoding vs 2 elsewhere.
    eps = [endpoint(0, in_flight=40), endpoint(1, in_flight=2), endpoint(2, in_flight=2)]
    bound = {"load_bound": {}}  # the bounded-load guard is opt-in
    assert decide("kvgate", request(4096), eps, {"pod-0": 200}).endpoint_id == "pod-0"
    d = decide("kvgate", request(4096), eps, {"pod-0": 200}, params=bound)
    assert d.endpoint_id != "pod-0"
    assert d.reason == "load-bound"
    d = decide("kvgate", request(4096), eps, {"pod-0": 200}, params={"load_bound": {"factor": 5}})
    assert d.endpoint_id == "pod-0"


def test_no_hit_requests_spread_evenly() -> None:
    policy = build_policy("kvgate")
    in_flight: Counter[str] = Counter()
    history, rng = ChoiceHistory(), random.Random(2)
    for _ in range(40):  # each request stays in flight, as under a burst
        eps = [endpoint(i, in_flight=in_flight[f"pod-{i}"]) for i in range(4)]
        d = policy.decide(request(512), eps, {}, now=0.0, rng=rng, history=history)
        history.record(d.endpoint_id)
        in_flight[d.endpoint_id] += 1
        assert d.reason == "no-hit-spread"
    assert in_flight == {f"pod-{i}": 10 for i in range(4)}


def test_a_cold_request_goes_where_the_fewest_requests_decode() -> None:
    # Equal prefill queues (none); a cold prefill stalls the decodes beside it.
    eps = [endpoint(0, in_flight=9), endpoint(1, in_flight=3), endpoint(2, in_flight=6)]
    assert decide("kvgate", request(2048), eps, {}).endpoint_id == "pod-1"


def test_no_hit_requests_prefer_the_less_loaded_pod() -> None:
    eps = [
        endpoint(0, pending_prefill_tokens=20_000),
        endpoint(1),
        endpoint(2, pending_prefill_tokens=20_000),
    ]
    assert decide("kvgate", request(512), eps, {}).endpoint_id == "pod-1"


def test_cold_request_reaches_an_unmeasured_idle_pod() -> None:
    # Three pods measured at ~30k tokens/s (3x the prior) and one fresh pod. Priced at the prior,
    # the fresh pod looked 3x slower, got no traffic and was never measured.
    measured = [endpoint(i, prefill_tokens_per_second=30_000.0) for i in range(3)]
    fresh = endpoint(3)
    history = ChoiceHistory()
    for e in measured:
        history.record(e.id)
    d = decide("kvgate", request(8192), [*measured, fresh], {}, history=history)
    assert d.reason == "no-hit-spread"
    assert d.endpoint_id == "pod-3"
    # Measured pods with a little work queued: the idle fresh pod is the fastest, every seed.
    busy = [
        endpoint(i, prefill_tokens_per_second=30_000.0, pending_prefill_tokens=4096)
        for i in range(3)
    ]
    for seed in range(20):
        assert decide("kvgate", request(8192), [*busy, fresh], {}, seed=seed).endpoint_id == "pod-3"


def test_near_equal_costs_are_broken_at_random() -> None:
    # pod-0 and pod-1 both hold the prefix; pod-1 is marginally busier: near-equal.
    eps = [endpoint(0), endpoint(1, pending_prefill_tokens=50), endpoint(2)]
    matched = {"pod-0": 200, "pod-1": 200}
    chosen = Counter(
        decide("kvgate", request(4096), eps, matched, seed=s).endpoint_id for s in range(200)
    )
    assert set(chosen) == {"pod-0", "pod-1"}
    assert min(chosen.values()) > 60
    strict = Counter(
        decide("kvgate", request(4096), eps, matched, seed=s, params={"tolerance": 0}).endpoint_id
        for s in range(50)
    )
    assert strict == {"pod-0": 50}


def test_near_equal_holders_go_to_the_pod_with_the_fewest_requests() -> None:
    # A prefix every pod holds most of (a group copied to every pod), none queueing prefill: every
    # pod is near-equal. A random draw let requests pile onto a few pods; the fewest requests
    # keeps them apart.
    eps = [endpoint(0, in_flight=6), endpoint(1, in_flight=2), endpoint(2, in_flight=4)]
    matched = {e.id: 220 for e in eps}  # 220 of 256 blocks: above the 0.8 affinity threshold
    for seed in range(20):
        assert decide("kvgate", request(4096), eps, matched, seed=seed).endpoint_id == "pod-1"
    drawn = {
        decide(
            "kvgate", request(4096), eps, matched, seed=s, params={"tie_break": "random"}
        ).endpoint_id
        for s in range(50)
    }
    assert drawn == {"pod-0", "pod-1", "pod-2"}


def test_a_new_session_on_a_shared_system_prompt_goes_to_the_least_recently_chosen_pod() -> None:
    # A new session's first turn: every pod holds its system prompt (half the prompt) and none
    # queues prefill. Its later turns will follow it, and the requests in flight now do not show
    # the sessions thinking between turns: the pods take new sessions in turn.
    eps = [endpoint(0, in_flight=6), endpoint(1, in_flight=2), endpoint(2, in_flight=4)]
    matched = {e.id: 128 for e in eps}
    history = ChoiceHistory()
    for eid in ["pod-2", "pod-1", "pod-0"]:
        history.record(eid)
    for seed in range(20):
        d = decide("kvgate", request(4096), eps, matched, seed=seed, history=history)
        assert d.endpoint_id == "pod-2"
    assert d.to_dict()["tie_break"] == "least-recent"  # /debug/route names the rule
    by_load = {"partial_hit_tie_break": "least-load"}
    d = decide("kvgate", request(4096), eps, matched, history=history, params=by_load)
    assert d.endpoint_id == "pod-1"
    assert d.to_dict()["tie_break"] == "least-load"


def test_a_hot_prefix_is_copied_when_its_only_holder_runs_far_more_requests() -> None:
    """A 2k-token system prompt with a short question: the holder queues no prefill, so the
    TTFT model prefers it however many requests it decodes; past the holder-load bounds the
    request copies the prefix to the least-loaded pod (`llm-d-sticky` keeps piling on)."""
    eps = [endpoint(0, in_flight=60), endpoint(1, in_flight=10), endpoint(2, in_flight=12)]
    req = request(2176)
    matched = {"pod-0": 128}
    d = decide("kvgate", req, eps, matched)
    assert d.endpoint_id == "pod-1" and d.reason == "load-bound"
    assert decide("llm-d-sticky", req, eps, matched).endpoint_id == "pod-0"
    assert decide("kvgate", req, eps, matched, params={"holder_load": None}).endpoint_id == "pod-0"
    calm = [endpoint(0, in_flight=30), endpoint(1, in_flight=10), endpoint(2, in_flight=12)]
    assert decide("kvgate", req, calm, matched).endpoint_id == "pod-0"


def test_a_short_request_on_a_head_every_pod_holds_goes_to_a_short_queue() -> None:
    """A one-line follow-up on the system prompt that starts every request: every pod holds
    the head and runs requests sharing it. The pod with the fewest requests has 4 s of prefill
    queued; two busier pods have none. The request goes to one of those, not behind the queue
    (before, the hot-prefix bounds dropped every pod but the least loaded)."""
    eps = [
        endpoint(0, in_flight=9),
        endpoint(1, in_flight=4, pending_prefill_tokens=40_000, pending_prefill_requests=1),
        endpoint(2, in_flight=9),
    ]
    req = request(537, prefix_sharers={"pod-0": 9, "pod-1": 4, "pod-2": 9})
    matched = {"pod-0": 32, "pod-1": 32, "pod-2": 32}
    for seed in range(10):
        assert decide("kvgate", req, eps, matched, seed=seed).endpoint_id in ("pod-0", "pod-2")


def test_router_replicas_seeing_the_same_state_do_not_herd() -> None:
    """A burst of cold requests from 4 replicas with the same (stale) view spreads out."""
    eps = fleet(8)
    policy = build_policy("kvgate")
    chosen: Counter[str] = Counter()
    for replica in range(4):
        history, rng = ChoiceHistory(), random.Random(replica)
        for _ in range(2):
            d = policy.decide(request(512), eps, {}, now=0.0, rng=rng, history=history)
            history.record(d.endpoint_id)
            chosen[d.endpoint_id] += 1
    assert len(chosen) >= 5
    assert max(chosen.values()) <= 3


def simulate_hot_prefix(
    policy_name: str, n_requests: int, params: dict[str, object] | None = None
) -> dict[str, int]:
    """Requests sharing one 2048-token system prompt, each with a 256-token unique suffix.

    No request completes during the burst: each routed request adds its uncached tokens to the
    chosen pod's pending prefill, and a pod holds the shared prefix from its first request on.
    """
    policy = build_policy(policy_name, params)
    pending = {f"pod-{i}": 0 for i in range(4)}
    holders: set[str] = set()
    history, rng = ChoiceHistory(), random.Random(0)
    req = request(2048 + 256)
    for _ in range(n_requests):
        eps = [
            endpoint(pid, pending_prefill_tokens=tok, pending_prefill_requests=1 if tok else 0)
            for pid, tok in pending.items()
        ]
        d = policy.decide(req, eps, {h: 128 for h in holders}, now=0.0, rng=rng, history=history)
        history.record(d.endpoint_id)
        pending[d.endpoint_id] += req.prompt_tokens - d.predicted_hit_tokens
        holders.add(d.endpoint_id)
    return pending


def test_hot_prefix_replicates_once_queueing_costs_more_than_recomputing() -> None:
    # 200 x 256 unique tokens: 5 s of prefill at the 10k tokens/s prior, on one holder.
    prefix_pending = simulate_hot_prefix("prefix", 200)
    assert sorted(prefix_pending.values())[:3] == [0, 0, 0]  # piles onto one pod
    # Under llm-d's default threshold (286,704 tokens) only the 5 s affinity cap moves requests:
    # no queue goes past 5 s of prefill at the 10k tokens/s prior by more than one request.
    default = simulate_hot_prefix("kvgate", 200)
    assert max(default.values()) <= 5.0 * 10_000 + 2048 + 256
    assert sum(1 for v in default.values() if v) >= 2
    # Holders keep it until they are the threshold ahead: a smaller one copies the prefix.
    gate = {"affinity": {"max_ttft_penalty_ms": 300, "peak_prefill_tokens_per_second": 10_000}}
    kv_pending = simulate_hot_prefix("kvgate", 200, gate)
    assert all(v > 0 for v in kv_pending.values())  # replicated to every pod
    # kvgate's worst queue is far shorter than piling everything on the holder.
    assert max(kv_pending.values()) < max(prefix_pending.values()) / 2


def test_round_robin_rotates_over_healthy_pods() -> None:
    policy = build_policy("round-robin")
    eps = [*fleet(3), endpoint(3, healthy=False)]
    history = ChoiceHistory()
    order = []
    for _ in range(6):
        d = policy.decide(
            request(), eps, {"pod-2": 100}, now=0.0, rng=random.Random(0), history=history
        )
        history.record(d.endpoint_id)
        order.append(d.endpoint_id)
        assert d.reason == "round-robin"
    assert order == ["pod-0", "pod-1", "pod-2"] * 2


def test_least_load_picks_fewest_requests() -> None:
    eps = [endpoint(0, in_flight=5), endpoint(1, in_flight=1), endpoint(2, in_flight=3)]
    d = decide("least-load", request(), eps, {"pod-0": 250})
    assert (d.endpoint_id, d.reason) == ("pod-1", "least-load")


def test_prefix_policy_longest_match_ties_by_load() -> None:
    eps = [endpoint(0, in_flight=9), endpoint(1, in_flight=4), endpoint(2, in_flight=1)]
    d = decide("prefix", request(4096), eps, {"pod-0": 200, "pod-1": 200, "pod-2": 100})
    assert (d.endpoint_id, d.reason) == ("pod-1", "prefix-hit")
    d = decide("prefix", request(4096), eps, {})
    assert (d.endpoint_id, d.reason) == ("pod-2", "least-load")


def test_decision_explains_every_candidate() -> None:
    eps: list[EndpointSnapshot] = [endpoint(0), endpoint(1, healthy=False), endpoint(2)]
    d = decide("kvgate", request(4096), eps, {"pod-0": 100})
    body = d.to_dict()
    assert body["endpoint"] == "pod-0" and body["reason"] == "prefix-hit"
    assert body["predicted_hit_tokens"] == 1600
    assert body["tie_break"] is None  # the holder led alone
    cold = decide("kvgate", request(4096), eps, {}).to_dict()
    assert cold["tie_break"] == "least-turnover" and cold["reason"] == "no-hit-spread"
    assert decide("round-robin", request(4096), eps, {}).to_dict()["tie_break"] is None
    by_id = {c["endpoint"]: c for c in body["candidates"]}
    assert by_id["pod-1"]["dropped_by"] == "healthy"
    assert by_id["pod-0"]["scores"]["predicted-ttft"] == 1.0
    assert by_id["pod-2"]["predicted_ttft_seconds"] == pytest.approx(4096 / RATE, rel=1e-4)


def test_a_holder_that_cannot_serve_does_not_count_as_a_hit() -> None:
    eps = [endpoint(0, healthy=False), endpoint(1), endpoint(2)]
    d = decide("kvgate", request(4096), eps, {"pod-0": 250})
    assert d.endpoint_id != "pod-0"
    assert d.reason == "no-hit-spread"


def test_pipeline_total_is_the_weighted_mean_of_scores() -> None:
    eps = [endpoint(0, in_flight=1), endpoint(1)]
    params = {
        "scorers": [
            {"name": "prefix-cache", "weight": 3},
            {"name": "queue-depth", "weight": 1},
        ]
    }
    d = decide("pipeline", request(1600), eps, {"pod-0": 50}, params=params)
    lines = {c.estimate.endpoint_id: c for c in d.candidates}
    assert lines["pod-0"].scores == {"prefix-cache": 0.5, "queue-depth": 0.5}
    assert lines["pod-0"].total_score == pytest.approx((3 * 0.5 + 0.5) / 4)
    assert lines["pod-1"].total_score == pytest.approx(1 / 4)
    assert (d.endpoint_id, d.reason) == ("pod-0", "prefix-hit")
