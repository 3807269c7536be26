"""Contracts of every plugin: scores in [0, 1], purity, filter/picker invariants, and each one's rule."""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import replace

import pytest
from scoring_helpers import cycle_state, endpoint, fleet, random_case, request

from kvgate.scoring.base import (
    ChoiceHistory,
    EndpointSnapshot,
    EngineLoad,
    PrefixCopy,
    RoutingRequest,
)
from kvgate.scoring.plugins.affinity_cap import AffinityCapFilter, AffinityCapParams
from kvgate.scoring.plugins.class_isolation import ClassIsolationFilter, ClassIsolationParams
from kvgate.scoring.plugins.healthy import HealthyFilter
from kvgate.scoring.plugins.holder_load import HolderLoadFilter, HolderLoadParams
from kvgate.scoring.plugins.kv_cache_usage import KvCacheUsageParams, KvCacheUsageScorer
from kvgate.scoring.plugins.load_bound import LoadBoundFilter, LoadBoundParams
from kvgate.scoring.plugins.near_equal import NearEqualParams, NearEqualPicker
from kvgate.scoring.plugins.predicted_ttft import PredictedTtftParams, PredictedTtftScorer
from kvgate.scoring.plugins.prefix_cache import PrefixCacheScorer
from kvgate.scoring.plugins.queue_depth import QueueDepthScorer
from kvgate.scoring.plugins.round_robin import RoundRobinPicker
from kvgate.scoring.registry import default_registry

REGISTRY = default_registry()
CASES = 300


@pytest.mark.parametrize("name", REGISTRY.names("scorer"))
def test_scores_are_in_unit_interval_and_inputs_unchanged(name: str) -> None:
    scorer = REGISTRY.scorer(name)
    rng = random.Random(name)
    for _ in range(CASES):
        req, eps, matched, now = random_case(rng)
        state = cycle_state(req, eps, matched, now)
        before = (copy.deepcopy(eps), dict(matched), req)
        scores = scorer.score(state, eps)
        assert len(scores) == len(eps)
        assert all(0.0 <= s <= 1.0 for s in scores), (name, scores)
        assert (eps, matched, req) == before


@pytest.mark.parametrize("name", REGISTRY.names("filter"))
def test_filters_return_a_subsequence_and_guards_never_empty(name: str) -> None:
    flt = REGISTRY.filter(name)
    rng = random.Random(name)
    for _ in range(CASES):
        req, eps, matched, now = random_case(rng)
        state = cycle_state(req, eps, matched, now)
        before = copy.deepcopy(eps)
        kept = list(flt.filter(state, eps))
        assert eps == before
        it = iter(eps)
        assert all(any(k is e for e in it) for k in kept), "not an order-preserving subsequence"
        if flt.reason is not None:
            assert kept, f"guard {name} emptied the candidates"


@pytest.mark.parametrize("name", REGISTRY.names("picker"))
def test_pickers_choose_a_candidate_deterministically_for_a_seed(name: str) -> None:
    picker = REGISTRY.picker(name)
    rng = random.Random(name)
    for _ in range(CASES):
        req, eps, matched, now = random_case(rng)
        totals = [rng.random() for _ in eps]
        a = picker.pick(cycle_state(req, eps, matched, now, seed=5), eps, totals)
        b = picker.pick(cycle_state(req, eps, matched, now, seed=5), eps, totals)
        assert a in eps and a == b


def test_healthy_drops_unhealthy_and_draining_and_may_empty() -> None:
    eps = [endpoint(0), endpoint(1, healthy=False), endpoint(2, draining=True)]
    state = cycle_state(request(), eps, {})
    assert [e.id for e in HealthyFilter().filter(state, eps)] == ["pod-0"]
    assert list(HealthyFilter().filter(state, eps[1:])) == []


def test_load_bound_drops_pods_above_c_times_mean() -> None:
    eps = [endpoint(0, in_flight=30), endpoint(1, in_flight=10), endpoint(2, in_flight=10)]
    state = cycle_state(request(), eps, {})
    flt = LoadBoundFilter(LoadBoundParams(factor=1.25, slack_requests=0))
    # mean with this request = 51/3 = 17, bound 21.25: pod-0 (31 > 21.25) is out
    assert [e.id for e in flt.filter(state, eps)] == ["pod-1", "pod-2"]


def test_load_bound_slack_keeps_low_loads_together() -> None:
    eps = [endpoint(0, in_flight=2), endpoint(1), endpoint(2)]
    state = cycle_state(request(), eps, {})
    assert len(LoadBoundFilter(LoadBoundParams(slack_requests=4)).filter(state, eps)) == 3
    assert len(LoadBoundFilter(LoadBoundParams(slack_requests=0)).filter(state, eps)) == 2


def test_load_bound_uses_engine_reported_load() -> None:
    eng = EngineLoad(waiting=40, running=20, kv_cache_usage=0.5)
    eps = [endpoint(0, engine=eng), endpoint(1), endpoint(2)]
    state = cycle_state(request(), eps, {})
    assert [e.id for e in LoadBoundFilter().filter(state, eps)] == ["pod-1", "pod-2"]


def test_holder_load_moves_a_hot_prefix_off_an_overloaded_holder_only() -> None:
    """The holder of the whole prompt runs 60 requests, the others 10: over both bounds (10 + 32
    and 2 x 10), so it takes no more; pods without the prefix are never dropped."""
    eps = [endpoint(0, in_flight=60), endpoint(1, in_flight=10), endpoint(2, in_flight=50)]
    state = cycle_state(request(), eps, {"pod-0": 256})
    flt = HolderLoadFilter()
    assert [e.id for e in flt.filter(state, eps)] == ["pod-1", "pod-2"]
    # a second holder within the bounds keeps the prefix's requests
    state = cycle_state(request(), eps, {"pod-0": 256, "pod-1": 256})
    assert [e.id for e in flt.filter(state, eps)] == ["pod-1", "pod-2"]


def test_holder_load_does_not_spread_online_traffic_onto_pods_batch_work_borrowed() -> None:
    """Online traffic gathered on one pod while batch borrows the others is class isolation's
    aim: the lighter pods host batch requests, so the online holder keeps its prefix."""
    eps = [
        endpoint(0, in_flight=60),
        endpoint(1, in_flight=10, batch_in_flight=10),
        endpoint(2, in_flight=12, batch_in_flight=12),
    ]
    state = cycle_state(request(), eps, {"pod-0": 256})
    assert len(HolderLoadFilter().filter(state, eps)) == 3
    state = cycle_state(request(request_class="batch"), eps, {"pod-0": 256})
    assert [e.id for e in HolderLoadFilter().filter(state, eps)] == ["pod-1", "pod-2"]


def test_holder_load_keeps_holders_within_either_bound() -> None:
    flt = HolderLoadFilter()
    gap_only = [endpoint(0, in_flight=140), endpoint(1, in_flight=100)]  # +40 but 1.4x
    state = cycle_state(request(), gap_only, {"pod-0": 256})
    assert len(flt.filter(state, gap_only)) == 2
    ratio_only = [endpoint(0, in_flight=30), endpoint(1, in_flight=2)]  # 15x but +28
    state = cycle_state(request(), ratio_only, {"pod-0": 256})
    assert len(flt.filter(state, ratio_only)) == 2
    # a pod holding less than affinity_threshold of the blocks is not a holder
    over = [endpoint(0, in_flight=60), endpoint(1, in_flight=10)]
    state = cycle_state(request(), over, {"pod-0": 100})
    assert len(flt.filter(state, over)) == 2
    state = cycle_state(request(), over, {"pod-0": 100})
    assert len(HolderLoadFilter(HolderLoadParams(affinity_threshold=0.3)).filter(state, over)) == 1


def test_holder_load_keeps_affinity_longer_while_every_pod_is_busy() -> None:
    """Every pod runs more than the 32-request gap: a copy would take capacity the fleet does
    not have, so the holder keeps its prefix up to twice the least-loaded pod's load."""
    flt = HolderLoadFilter()
    busy = [endpoint(0, in_flight=110), endpoint(1, in_flight=67)]  # +43 and 1.6x
    state = cycle_state(request(), busy, {"pod-0": 256})
    assert len(flt.filter(state, busy)) == 2
    crowded = [endpoint(0, in_flight=140), endpoint(1, in_flight=67)]  # +73 and 2.1x
    state = cycle_state(request(), crowded, {"pod-0": 256})
    assert [e.id for e in flt.filter(state, crowded)] == ["pod-1"]
    # next to a pod with few requests the gap decides: 43 against 10 is a move
    light = [endpoint(0, in_flight=43), endpoint(1, in_flight=10)]
    state = cycle_state(request(), light, {"pod-0": 256})
    assert [e.id for e in flt.filter(state, light)] == ["pod-1"]


def test_holder_load_copies_a_prefix_hot_on_its_holder_sooner() -> None:
    """Three of the holder's requests in flight carry the request's whole matched prefix (a
    shared system prompt): the holder is dropped once it runs more than 3 requests above and 2x
    the least-loaded pod, far inside the wide bounds (32 requests and 1.5x). With fewer sharers
    (a session's own history), none counted (a router without blocks in flight), or a prefix
    that takes seconds to compute elsewhere, it stays."""
    eps = [endpoint(0, in_flight=9), endpoint(1, in_flight=4), endpoint(2, in_flight=3)]
    flt = HolderLoadFilter()

    def kept(sharers: dict[str, int] | None, eps: list[EndpointSnapshot] = eps) -> list[str]:
        state = cycle_state(request(prefix_sharers=sharers), eps, {"pod-0": 256})
        return [e.id for e in flt.filter(state, eps)]

    assert kept({"pod-0": 3}) == ["pod-1", "pod-2"]  # 9 > max(3 + 3, 2 x 3)
    assert kept({"pod-0": 2}) == ["pod-0", "pod-1", "pod-2"]
    assert kept(None) == ["pod-0", "pod-1", "pod-2"]
    within = [endpoint(0, in_flight=6), endpoint(1, in_flight=3)]  # +3: not above the gap
    assert kept({"pod-0": 6}, within) == ["pod-0", "pod-1"]
    gap_only = [endpoint(0, in_flight=25), endpoint(1, in_flight=13)]  # +12 but 1.9x
    assert kept({"pod-0": 25}, gap_only) == ["pod-0", "pod-1"]
    # the sharers must be on the holder: a loaded non-holder is never dropped
    state = cycle_state(request(prefix_sharers={"pod-0": 9}), eps, {"pod-1": 256})
    assert len(flt.filter(state, eps)) == 3
    # a shared document (32k tokens: ~3 s to compute at the prior rate) is not copied early
    document = request(32_768, prefix_sharers={"pod-0": 9})
    assert len(flt.filter(cycle_state(document, eps, {"pod-0": 2048}), eps)) == 3
    cheap = HolderLoadFilter(HolderLoadParams(hot_max_copy_seconds=5.0))
    assert len(cheap.filter(cycle_state(document, eps, {"pod-0": 2048}), eps)) == 2


def test_holder_load_copies_a_long_hot_prefix_in_the_background() -> None:
    """A shared document (32k tokens, ~3 s to compute elsewhere) hot on its holder keeps its
    requests there (the filter above), and the copier proposes to compute it on the least-loaded
    pod that lacks it: the holder's matched blocks, the tokens that pod lacks, its predicted
    time. Nothing when the prefix is cheap to copy (the filter moves a request instead), not hot,
    not held by the chosen pod, held everywhere, not sendable alone (a chat prompt with
    approximate keys), or switched off."""
    eps = [endpoint(0, in_flight=9), endpoint(1, in_flight=4), endpoint(2, in_flight=3)]
    flt = HolderLoadFilter()
    document = request(32_768, prefix_sharers={"pod-0": 9})

    def proposed(
        req: RoutingRequest = document,
        matched: dict[str, int] | None = None,
        chosen: int = 0,
        plugin: HolderLoadFilter = flt,
        eps: list[EndpointSnapshot] = eps,
    ) -> PrefixCopy | None:
        state = cycle_state(req, eps, {"pod-0": 2048} if matched is None else matched)
        return plugin.copy(state, eps, eps[chosen])

    copy = proposed()
    assert copy is not None and copy.endpoint_id == "pod-2" and copy.blocks == 2048
    assert copy.tokens == 32_768 and copy.seconds > 0.5
    # a pod holding part of it computes the rest only
    part = proposed(matched={"pod-0": 2048, "pod-2": 1024})
    assert part is not None and part.endpoint_id == "pod-2" and part.tokens == 16_384
    assert proposed(request(prefix_sharers={"pod-0": 9}), {"pod-0": 256}) is None
    assert proposed(request(32_768, prefix_sharers={"pod-0": 2})) is None
    assert proposed(chosen=1) is None
    everywhere = {"pod-0": 2048, "pod-1": 2048, "pod-2": 2048}
    assert proposed(matched=everywhere) is None
    chat_text = request(32_768, prefix_sharers={"pod-0": 9}, keys_exact=False, copyable=False)
    assert proposed(chat_text) is None
    completion_text = request(32_768, prefix_sharers={"pod-0": 9}, keys_exact=False)
    assert proposed(completion_text) is not None
    off = HolderLoadFilter(HolderLoadParams(background_copies=False))
    assert proposed(plugin=off) is None
    # within the hot bounds (3 above the least-loaded pod) nothing is copied
    within = [endpoint(0, in_flight=6), endpoint(1, in_flight=3)]
    assert proposed(eps=within) is None
    # an unhealthy or draining pod is no target
    sick = [eps[0], eps[1], endpoint(2, in_flight=3, healthy=False)]
    retry = proposed(eps=sick)
    assert retry is not None and retry.endpoint_id == "pod-1"


def test_holder_load_copies_a_burst_on_a_prefix_to_an_idle_pod() -> None:
    """While a pod is idle, a holder with two requests in flight on the request's prefix (the
    first still computing it) takes no more of it: the next request computes the prefix on the
    idle pod instead of waiting for that prefill. One request in flight on the prefix (a
    session's next turn), no idle pod, or a prefix that takes seconds to compute keep it."""
    eps = [endpoint(0, in_flight=2), endpoint(1), endpoint(2, in_flight=1)]
    flt = HolderLoadFilter()

    def kept(
        req: RoutingRequest, eps: list[EndpointSnapshot] = eps, blocks: int = 256
    ) -> list[str]:
        return [e.id for e in flt.filter(cycle_state(req, eps, {"pod-0": blocks}), eps)]

    assert kept(request(prefix_sharers={"pod-0": 2})) == ["pod-1", "pod-2"]
    assert kept(request(prefix_sharers={"pod-0": 1})) == ["pod-0", "pod-1", "pod-2"]
    # pod-1 runs a request the engine reports (another router's): nobody is idle
    running = EngineLoad(waiting=0, running=1, kv_cache_usage=0.1)
    busy = [endpoint(0, in_flight=2), endpoint(1, engine=running), endpoint(2, in_flight=1)]
    assert kept(request(prefix_sharers={"pod-0": 2}), busy) == ["pod-0", "pod-1", "pod-2"]
    document = request(32_768, prefix_sharers={"pod-0": 2})  # ~3 s to compute elsewhere
    assert kept(document, blocks=2048) == ["pod-0", "pod-1", "pod-2"]
    later = HolderLoadFilter(HolderLoadParams(idle_copy_sharers=3))
    state = cycle_state(request(prefix_sharers={"pod-0": 2}), eps, {"pod-0": 256})
    assert len(later.filter(state, eps)) == 3
    # above the hot gap the rule is off: the hot bounds (more than 3 above the idle pod) apply
    off = HolderLoadFilter(HolderLoadParams(idle_copy_sharers=1000))
    hot = [endpoint(0, in_flight=4), endpoint(1), endpoint(2, in_flight=1)]
    state = cycle_state(request(prefix_sharers={"pod-0": 4}), hot, {"pod-0": 256})
    assert [e.id for e in off.filter(state, hot)] == ["pod-1", "pod-2"]


def test_holder_load_hot_bounds_need_a_pod_to_copy_the_prefix_to() -> None:
    """When every candidate holds the prefix (one system prompt at the head of every request),
    every pod is hot and there is nothing to copy: the hot bounds would only narrow the choice
    to the pods with the fewest requests, whatever their queues. The wide bounds still apply."""
    eps = [endpoint(0, in_flight=9), endpoint(1, in_flight=4), endpoint(2, in_flight=9)]
    everywhere = {"pod-0": 256, "pod-1": 256, "pod-2": 256}
    sharers = {"pod-0": 9, "pod-1": 4, "pod-2": 9}
    state = cycle_state(request(prefix_sharers=sharers), eps, everywhere)
    assert len(HolderLoadFilter().filter(state, eps)) == 3
    # the same loads with pod-1 lacking the prefix: pod-0 and pod-2 copy it there
    state = cycle_state(request(prefix_sharers=sharers), eps, {"pod-0": 256, "pod-2": 256})
    assert [e.id for e in HolderLoadFilter().filter(state, eps)] == ["pod-1"]
    wide = [endpoint(0, in_flight=60), endpoint(1, in_flight=10), endpoint(2, in_flight=12)]
    state = cycle_state(request(prefix_sharers={"pod-0": 60}), wide, everywhere)
    assert [e.id for e in HolderLoadFilter().filter(state, wide)] == ["pod-1", "pod-2"]


def test_affinity_cap_drops_long_queues_only_when_another_pod_is_within() -> None:
    eps = [endpoint(0, pending_prefill_tokens=50_000), endpoint(1, pending_prefill_tokens=1000)]
    state = cycle_state(request(), eps, {"pod-0": 200})
    flt = AffinityCapFilter(AffinityCapParams(max_affinity_wait_seconds=2.0))
    assert [e.id for e in flt.filter(state, eps)] == ["pod-1"]
    both_long = [
        endpoint(0, pending_prefill_tokens=50_000),
        endpoint(1, pending_prefill_tokens=30_000),
    ]
    state = cycle_state(request(), both_long, {})
    assert len(flt.filter(state, both_long)) == 2


def test_class_isolation_moves_online_requests_off_borrowed_pods_only_when_nearly_free() -> None:
    flt = ClassIsolationFilter(ClassIsolationParams(max_extra_seconds=0.05))
    # pod-0 holds the 4k prompt but runs a borrowed batch request; recomputing it on pod-1
    # costs ~0.4 s at the 10k tokens/s prior, more than the 0.05 s a move may cost.
    eps = [endpoint(0, in_flight=1, batch_in_flight=1), endpoint(1), endpoint(2)]
    long_hit = cycle_state(request(4096), eps, {"pod-0": 250})
    assert [e.id for e in flt.filter(long_hit, eps)] == ["pod-0", "pod-1", "pod-2"]
    # A short prompt costs as much anywhere: the pods without batch work are kept.
    short = cycle_state(request(256), eps, {"pod-0": 15})
    assert [e.id for e in flt.filter(short, eps)] == ["pod-1", "pod-2"]
    # Batch requests, and fleets where every pod hosts as many batch requests, keep every pod.
    as_batch = cycle_state(request(256, request_class="batch"), eps, {"pod-0": 15})
    assert len(flt.filter(as_batch, eps)) == 3
    all_batch = [endpoint(i, in_flight=1, batch_in_flight=1) for i in range(3)]
    state = cycle_state(request(256), all_batch, {})
    assert len(flt.filter(state, all_batch)) == 3


def test_class_isolation_gathers_online_requests_where_batch_borrowed_least() -> None:
    # At start-up batch work borrows every pod: the online request goes to the pod with the
    # fewest batch requests, not to the one its prefix started on.
    flt = ClassIsolationFilter()
    eps = [endpoint(i, in_flight=3, batch_in_flight=n) for i, n in enumerate((3, 1, 2))]
    held_on_pod0 = cycle_state(request(1088), eps, {"pod-0": 64})
    assert [e.id for e in flt.filter(held_on_pod0, eps)] == ["pod-1"]


def test_class_isolation_yields_the_lightest_online_pod_while_batch_waits() -> None:
    # Online traffic on pod-0 and pod-1, batch work on pod-2; batch requests queue for a pod
    # to borrow. The online request leaves pod-1 (the lighter) so that it drains for them.
    flt = ClassIsolationFilter()
    eps = [
        endpoint(0, in_flight=30),
        endpoint(1, in_flight=18),
        endpoint(2, in_flight=16, batch_in_flight=16),
    ]
    held_on_both = {"pod-0": 64, "pod-1": 64}
    waiting = cycle_state(request(1088, batch_waiting=3), eps, held_on_both)
    assert [e.id for e in flt.filter(waiting, eps)] == ["pod-0"]
    kept_apart = ClassIsolationFilter(ClassIsolationParams(yield_to_batch=False))
    assert [e.id for e in kept_apart.filter(waiting, eps)] == ["pod-0", "pod-1"]
    # A cold prompt (nothing cached anywhere) is placed by load as before: no yield.
    cold = cycle_state(request(1088, batch_waiting=3), eps, {})
    assert [e.id for e in flt.filter(cold, eps)] == ["pod-0", "pod-1"]
    # No batch request waiting: both online pods stay candidates.
    calm = cycle_state(request(1088), eps, held_on_both)
    assert [e.id for e in flt.filter(calm, eps)] == ["pod-0", "pod-1"]
    # A pod that runs nothing is already free for batch work: nothing is yielded.
    idle = [endpoint(0, in_flight=30), endpoint(1), eps[2]]
    state = cycle_state(request(1088, batch_waiting=3), idle, held_on_both)
    assert [e.id for e in flt.filter(state, idle)] == ["pod-0", "pod-1"]
    # The other pod would answer too late (its queue): the lighter one is not yielded.
    slow = [endpoint(0, in_flight=30, pending_prefill_tokens=40_000), eps[1], eps[2]]
    state = cycle_state(request(1088, batch_waiting=3), slow, held_on_both)
    assert [e.id for e in flt.filter(state, slow)] == ["pod-1"]
    # Batch requests themselves are never steered by it.
    as_batch = cycle_state(request(1088, request_class="batch", batch_waiting=3), eps, held_on_both)
    assert len(flt.filter(as_batch, eps)) == 3


def test_prefix_cache_scores_share_of_prompt_held() -> None:
    eps = fleet(3)
    state = cycle_state(request(1600), eps, {"pod-0": 50, "pod-1": 100})
    assert PrefixCacheScorer().score(state, eps) == [0.5, pytest.approx(99 * 16 / 1600), 0.0]


def test_queue_depth_scores_relative_to_least_loaded() -> None:
    eps = [endpoint(0, in_flight=0), endpoint(1, in_flight=1), endpoint(2, in_flight=3)]
    assert QueueDepthScorer().score(cycle_state(request(), eps, {}), eps) == [1.0, 0.5, 0.25]


def test_kv_cache_usage_scores_fresh_reports_and_neutral_when_unknown() -> None:
    fresh = EngineLoad(waiting=0, running=0, kv_cache_usage=0.25)
    eps = [endpoint(0, engine=fresh), endpoint(2)]
    scorer = KvCacheUsageScorer(KvCacheUsageParams(unknown_score=0.4))
    assert scorer.score(cycle_state(request(), eps, {}, now=10.0), eps) == [0.75, 0.4]


def test_predicted_ttft_best_is_one_and_order_follows_cost() -> None:
    eps = [endpoint(0, pending_prefill_tokens=40_000), endpoint(1), endpoint(2)]
    state = cycle_state(request(8192), eps, {"pod-1": 400})
    scores = PredictedTtftScorer().score(state, eps)
    assert scores[1] == 1.0
    assert scores[0] < scores[2] < scores[1]


def test_predicted_ttft_prices_the_first_tokens_a_prefill_delays() -> None:
    # Equal predicted TTFT everywhere; pod-0 has two requests waiting for their first token
    # (their prefill done, so nothing of theirs is queued ahead of this one).
    eps = [endpoint(0, pending_prefill_requests=2), endpoint(1)]
    state = cycle_state(request(12_000), eps, {})
    assert PredictedTtftScorer().score(state, eps) == [1.0, 1.0]
    scorer = PredictedTtftScorer(PredictedTtftParams(pending_weight=1.0, chunk_tokens=8192))
    low, high = scorer.score(state, eps)
    assert high == 1.0
    # cost on pod-0: 1.2 s TTFT + 2 requests x 8192 tokens / 10k tokens/s
    assert low == pytest.approx((1.2 + 0.02) / (1.2 + 2 * 0.8192 + 0.02))


def test_predicted_ttft_prices_first_tokens_only_where_the_prompt_is_coldest() -> None:
    # pod-0 holds 8,000 of the 12,000 tokens and has two first tokens due; pod-1 holds none.
    # The price never pushes the request off pod-0 (its rest is short); on pod-1, it applies.
    scorer = PredictedTtftScorer(PredictedTtftParams(pending_weight=1.0, chunk_tokens=8192))
    holder = [endpoint(0, pending_prefill_requests=2), endpoint(1)]
    state = cycle_state(request(12_000), holder, {"pod-0": 500})
    assert scorer.score(state, holder) == PredictedTtftScorer().score(state, holder)
    cold = [endpoint(0), endpoint(1, pending_prefill_requests=2)]
    state = cycle_state(request(12_000), cold, {"pod-0": 500})
    unpriced = PredictedTtftScorer().score(state, cold)
    priced = scorer.score(state, cold)
    assert priced[0] == unpriced[0] == 1.0
    assert priced[1] < unpriced[1]


def test_predicted_ttft_prices_the_decode_on_the_pods_kv() -> None:
    # Equal predicted TTFT; pod-0's running requests hold 60% of a 200k-token cache, pod-1's 10%.
    def pod(i: int, usage: float) -> EndpointSnapshot:
        load = EngineLoad(waiting=0, running=8, kv_cache_usage=usage, kv_capacity_tokens=200_000)
        return endpoint(i, engine=load)

    eps = [pod(0, 0.6), pod(1, 0.1)]
    state = cycle_state(request(1000, expected_output_tokens=2000.0), eps, {})
    assert PredictedTtftScorer().score(state, eps) == [1.0, 1.0]
    scorer = PredictedTtftScorer(PredictedTtftParams(decode_weight=0.5))
    busy, light = scorer.score(state, eps)
    assert light == 1.0
    # cost = TTFT (+ the floor) + 0.5 x 2000 steps x the pod's KV tokens x 4.9e-8 s
    ttft = state.estimates["pod-0"].ttft_seconds + 0.02
    assert busy == pytest.approx(
        (ttft + 0.5 * 2000 * 20_000 * 4.9e-8) / (ttft + 0.5 * 2000 * 120_000 * 4.9e-8)
    )
    # no expectation of the answer's length (none learned yet): no decode price
    unknown = cycle_state(request(1000), eps, {})
    assert scorer.score(unknown, eps) == [1.0, 1.0]
    # every pod has a prefill queue (saturated, compute bound): no decode price either
    queued = [replace(e, pending_prefill_tokens=5_000) for e in eps]
    state = cycle_state(request(1000, expected_output_tokens=2000.0), queued, {})
    assert state.estimates["pod-0"].decode_seconds > state.estimates["pod-1"].decode_seconds
    assert scorer.score(state, queued) == PredictedTtftScorer().score(state, queued)
    # one pod without a queue: priced again
    mixed = [queued[0], eps[1]]
    state = cycle_state(request(1000, expected_output_tokens=2000.0), mixed, {})
    assert scorer.score(state, mixed) != PredictedTtftScorer().score(state, mixed)


def test_near_equal_randomises_among_near_equal_only() -> None:
    eps = fleet(4)
    picker = NearEqualPicker(NearEqualParams(tolerance=0.1))
    counts: Counter[str] = Counter()
    for seed in range(400):
        state = cycle_state(request(), eps, {}, seed=seed)
        counts[picker.pick(state, eps, [1.0, 0.95, 0.5, 0.91]).id] += 1
    assert set(counts) == {"pod-0", "pod-1", "pod-3"}
    assert min(counts.values()) > 80  # roughly uniform over the three


def test_near_equal_zero_tolerance_takes_the_best() -> None:
    eps = fleet(3)
    state = cycle_state(request(), eps, {})
    assert NearEqualPicker().pick(state, eps, [0.2, 0.9, 0.8]).id == "pod-1"


def test_near_equal_tie_breaks() -> None:
    eps = [endpoint(0, in_flight=3), endpoint(1, in_flight=1), endpoint(2, in_flight=2)]
    history = ChoiceHistory()
    for eid in ["pod-2", "pod-1", "pod-0"]:
        history.record(eid)
    state = cycle_state(request(), eps, {}, history=history)
    ties = [1.0, 1.0, 1.0]
    assert NearEqualPicker(NearEqualParams(tie_break="least-load")).pick(state, eps, ties).id == (
        "pod-1"
    )
    assert NearEqualPicker(NearEqualParams(tie_break="least-recent")).pick(state, eps, ties).id == (
        "pod-2"
    )


def test_near_equal_no_hit_tie_break_applies_only_without_hits() -> None:
    eps = fleet(3)
    history = ChoiceHistory()
    history.record("pod-0")
    history.record("pod-1")
    picker = NearEqualPicker(NearEqualParams(tie_break="random", no_hit_tie_break="least-recent"))
    cold = cycle_state(request(), eps, {}, history=history)
    assert {picker.pick(cold, eps, [1.0] * 3).id for _ in range(20)} == {"pod-2"}
    warm_ids = set()
    for seed in range(50):
        warm = cycle_state(request(), eps, {e.id: 10 for e in eps}, history=history, seed=seed)
        warm_ids.add(picker.pick(warm, eps, [1.0] * 3).id)
    assert warm_ids == {"pod-0", "pod-1", "pod-2"}


def test_near_equal_least_turnover_places_a_cold_prompt_where_the_cache_turns_over_slowest() -> (
    None
):
    """Among the pods with the fewest requests, once every one's KV cache has filled: the one
    this router sent the fewest uncached prompt tokens lately for its cache's size; before
    that, any of them."""
    history = ChoiceHistory()
    for pod_id, tokens, at in [("pod-0", 1000, 0.0), ("pod-1", 90_000, 0.0),
                               ("pod-2", 60_000, 0.0), ("pod-3", 40_000, 0.0)]:  # fmt: skip
        history.record(pod_id, tokens, at)

    def pod(i: int, in_flight: int, filled: bool = True, capacity: int = 100_000):
        engine = EngineLoad(0, in_flight, 0.5, kv_capacity_tokens=capacity, kv_filled=filled)
        return endpoint(i, in_flight=in_flight, engine=engine)

    picker = NearEqualPicker(NearEqualParams(tie_break="random", no_hit_tie_break="least-turnover"))
    ties = [1.0] * 4

    def picks(eps: list[EndpointSnapshot], hit: int = 0, now: float = 0.0) -> set[str]:
        matched = {e.id: hit for e in eps}
        return {picker.pick(cycle_state(request(), eps, matched, history=history, seed=s, now=now),
                            eps, ties).id for s in range(40)}  # fmt: skip

    # pod-0 has more requests; of the rest, pod-2 was sent the fewest tokens for its size
    filled = [pod(0, 2), pod(1, 1), pod(2, 1, capacity=200_000), pod(3, 1)]
    assert picks(filled) == {"pod-2"}  # 0.3 of its cache against 0.4 and 0.9
    # the tokens decay with a half-life of two minutes
    history.record("pod-3", 40_000, 120.0)  # pod-3: 20,000 + 40,000 of 100,000
    assert history.recent_uncached_tokens("pod-3", 120.0) == pytest.approx(60_000)
    assert picks(filled, now=120.0) == {"pod-2"}  # 0.15 against 0.45 (pod-1) and 0.6
    history.record("pod-2", 80_000, 120.0)  # pod-2: 30,000 + 80,000 of 200,000
    assert picks(filled, now=120.0) == {"pod-1"}  # 0.45 against 0.55 and 0.6
    # a pod whose cache has not filled (nothing evicted yet) or reports no size: any of them
    assert picks([*filled[:3], pod(3, 1, filled=False)], now=120.0) == {"pod-1", "pod-2", "pod-3"}
    assert picks([*filled[:3], pod(3, 1, capacity=0)], now=120.0) == {"pod-1", "pod-2", "pod-3"}
    # with a hit, tie_break applies instead
    assert picks(filled, hit=10, now=120.0) == {"pod-0", "pod-1", "pod-2", "pod-3"}


def test_near_equal_partial_hit_tie_break_applies_below_the_share() -> None:
    """A request every pod holds only the head of (a new conversation on a shared system prompt)
    goes to the pod chosen least recently; one they hold most of, or whose rest is a long
    prefill, to the fewest requests."""
    eps = [endpoint(0, in_flight=3), endpoint(1, in_flight=1), endpoint(2, in_flight=2)]
    history = ChoiceHistory()
    for eid in ["pod-2", "pod-1", "pod-0"]:
        history.record(eid)
    picker = NearEqualPicker(
        NearEqualParams(tie_break="least-load", partial_hit_tie_break="least-recent")
    )
    ties = [1.0] * 3

    def pick(matched_blocks: int, prompt_tokens: int = 4096) -> str:
        matched = {e.id: matched_blocks for e in eps}
        state = cycle_state(request(prompt_tokens), eps, matched, history=history)
        return picker.pick(state, eps, ties).id

    # At the prior 10k tokens/s: 4,096 - 1,600 tokens computed in 0.25 s.
    assert pick(100) == "pod-2"  # 100 of 256 blocks: partial, least recent
    assert pick(204) == "pod-2"  # 79.7%: still below the 80% share
    assert pick(205) == "pod-1"  # 80.1%: most of the prompt, fewest requests
    assert pick(0) == "pod-1"  # no hit: no_hit_tie_break, unset, falls back to tie_break
    assert pick(100, prompt_tokens=4112) == "pod-1"  # the rest takes just over 0.25 s
    without = NearEqualPicker(NearEqualParams(tie_break="least-load"))
    state = cycle_state(request(4096), eps, {e.id: 100 for e in eps}, history=history)
    assert without.pick(state, eps, ties).id == "pod-1"


def test_near_equal_partial_hit_with_a_long_rest_is_picked_like_a_cold_one() -> None:
    """A partial hit whose rest takes longer than ``partial_hit_max_prefill_seconds`` is a cold
    prefill in all but name: ``no_hit_tie_break`` picks it, not ``tie_break``."""
    eps = [endpoint(0, in_flight=3), endpoint(1, in_flight=1), endpoint(2, in_flight=2)]
    history = ChoiceHistory()
    for eid in ["pod-2", "pod-1", "pod-0"]:
        history.record(eid)
    picker = NearEqualPicker(
        NearEqualParams(
            tie_break="least-recent",
            no_hit_tie_break="least-load",
            partial_hit_tie_break="least-recent",
        )
    )
    ties = [1.0] * 3

    def pick(matched_blocks: int, prompt_tokens: int) -> tuple[str, str | None]:
        matched = {e.id: matched_blocks for e in eps}
        state = cycle_state(request(prompt_tokens), eps, matched, history=history)
        rule = picker.tie_break([state.estimates[e.id] for e in eps], ties)
        return picker.pick(state, eps, ties).id, rule

    # At the prior 10k tokens/s a 0.25 s rest is 2,500 tokens.
    assert pick(100, 4096) == ("pod-2", "least-recent")  # short rest: partial_hit_tie_break
    assert pick(100, 16_384) == ("pod-1", "least-load")  # 14,784-token rest: as if cold
    assert pick(1000, 16_384) == ("pod-2", "least-recent")  # 97.7% held: tie_break
    assert pick(0, 16_384) == ("pod-1", "least-load")  # no hit: no_hit_tie_break


def test_round_robin_cycles_and_takes_newcomers_first() -> None:
    eps = fleet(3)
    history = ChoiceHistory()
    picker = RoundRobinPicker()
    order = []
    for _ in range(6):
        chosen = picker.pick(cycle_state(request(), eps, {}, history=history), eps, [1.0] * 3)
        history.record(chosen.id)
        order.append(chosen.id)
    assert order == ["pod-0", "pod-1", "pod-2"] * 2
    eps2 = [*eps, endpoint(9)]
    chosen = picker.pick(cycle_state(request(), eps2, {}, history=history), eps2, [1.0] * 4)
    assert chosen.id == "pod-9"


def test_history_forgets_a_departed_pod() -> None:
    history = ChoiceHistory()
    for eid in ["pod-0", "pod-1", "pod-2"]:
        history.record(eid, uncached_tokens=100, now=1.0)
    history.forget("pod-1")
    assert history.last_chosen("pod-1") == -1 and len(history) == 2
    assert history.recent_uncached_tokens("pod-1", 1.0) == 0.0
    assert history.recent_uncached_tokens("pod-2", 1.0) == 100.0
