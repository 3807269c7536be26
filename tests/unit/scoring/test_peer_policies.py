"""The peers' re-implemented policies: each one's defining behaviour, with the peer's defaults.

Numbers are worked out by hand from the published rules (see each plugin's README), so a test
fails when the rule changes, not only when the code crashes.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest
from scoring_helpers import cycle_state, endpoint, fleet, request

from kvgate.scoring.base import ChoiceHistory, Decision, EndpointSnapshot, EngineLoad
from kvgate.scoring.plugins.kv_block_cost import KvBlockCostScorer
from kvgate.scoring.plugins.match_minus_load import MatchMinusLoadScorer
from kvgate.scoring.plugins.prefix_affinity import PrefixAffinityParams
from kvgate.scoring.plugins.softmax import SoftmaxParams, SoftmaxPicker
from kvgate.scoring.plugins.waiting_queue import WaitingQueueScorer
from kvgate.scoring.registry import build_policy

PEERS = ["llm-d-sticky", "gie-weighted", "dynamo-kv", "load-aware", "aibrix-prefix"]


def decide(
    name: str,
    req: object,
    eps: list[EndpointSnapshot],
    matched: dict[str, int],
    *,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    history: ChoiceHistory | None = None,
) -> Decision:
    policy = build_policy(name, params or {})
    return policy.decide(
        req,  # type: ignore[arg-type]
        eps,
        matched,
        now=0.0,
        rng=random.Random(seed),
        history=history or ChoiceHistory(),
    )


def engine(waiting: int = 0, running: int = 0, usage: float = 0.0) -> EngineLoad:
    return EngineLoad(waiting=waiting, running=running, kv_cache_usage=usage)


@pytest.mark.parametrize("name", PEERS)
def test_every_peer_spreads_cold_requests_and_reports_least_load(name: str) -> None:
    eps = fleet(4)
    history = ChoiceHistory()
    chosen = Counter()
    for i in range(40):
        d = decide(name, request(2048), eps, {}, seed=i, history=history)
        history.record(d.endpoint_id)
        chosen[d.endpoint_id] += 1
        assert d.reason == "least-load"
    assert len(chosen) == 4, chosen  # equal idle pods: no pod collects every cold request


# -- llm-d-sticky -----------------------------------------------------------------------------

TAU = 15_928 * 18  # peak prefill throughput x max TTFT penalty: 286,704 tokens


def test_llmd_tau_is_peak_throughput_times_max_penalty() -> None:
    assert PrefixAffinityParams().tau_tokens == pytest.approx(TAU)
    assert PrefixAffinityParams(
        peak_prefill_tokens_per_second=1000, max_ttft_penalty_ms=500
    ).tau_tokens == pytest.approx(500)


def test_llmd_sticky_keeps_a_holder_until_its_queue_exceeds_tau() -> None:
    req = request(8192)  # 512 blocks
    matched = {"pod-0": 512}
    for holder_queue, expected in [(TAU - 1000, "pod-0"), (TAU + 1000, "pod-1")]:
        eps = [endpoint(0, pending_prefill_tokens=holder_queue), endpoint(1), endpoint(2)]
        eps[2] = endpoint(2, pending_prefill_tokens=5000)
        d = decide("llm-d-sticky", req, eps, matched)
        assert d.endpoint_id == expected, holder_queue
        assert d.reason == ("prefix-hit" if expected == "pod-0" else "load-spill")
    # the gate compares with the *best* other pod: a busy fleet keeps the request on its holder
    busy = [endpoint(0, pending_prefill_tokens=TAU + 1000)]
    busy += [endpoint(i, pending_prefill_tokens=20_000) for i in (1, 2)]
    assert decide("llm-d-sticky", req, busy, matched).endpoint_id == "pod-0"


def test_llmd_sticky_needs_80_percent_of_the_blocks_and_explains_what_it_dropped() -> None:
    req = request(8192)  # 512 blocks; 0.8 x 512 = 409.6
    eps = [endpoint(0, pending_prefill_tokens=50_000), endpoint(1), endpoint(2)]
    d = decide("llm-d-sticky", req, eps, {"pod-0": 410})
    assert (d.endpoint_id, d.reason) == ("pod-0", "prefix-hit")
    dropped = {c.estimate.endpoint_id: c.dropped_by for c in d.candidates}
    assert dropped == {
        "pod-0": None,
        "pod-1": "prefix-cache-affinity",
        "pod-2": "prefix-cache-affinity",
    }
    # 409 of 512 blocks is below the threshold: not sticky, token load decides
    d = decide("llm-d-sticky", req, eps, {"pod-0": 409})
    assert d.endpoint_id in {"pod-1", "pod-2"} and d.reason == "load-spill"


def test_llmd_sticky_picks_the_least_token_loaded_holder() -> None:
    req = request(8192)
    eps = [
        endpoint(0, pending_prefill_tokens=30_000),
        endpoint(1, pending_prefill_tokens=10_000),
        endpoint(2),
    ]
    d = decide("llm-d-sticky", req, eps, {"pod-0": 512, "pod-1": 480})
    # pod-1 holds less (480 blocks) but has 20k fewer tokens queued; pod-2 is not sticky
    assert d.endpoint_id == "pod-1"
    assert d.reason == "load-spill"  # pod-0 held more and was not dropped


def test_llmd_sticky_penalty_zero_always_sticks_and_exploration_one_never_does() -> None:
    req = request(8192)
    eps = [endpoint(0, pending_prefill_tokens=10 * TAU), endpoint(1)]
    always = {"affinity": {"max_ttft_penalty_ms": 0}}
    assert decide("llm-d-sticky", req, eps, {"pod-0": 512}, params=always).endpoint_id == "pod-0"
    # 10k tokens queued on the holder vs 8192 uncached tokens of this request elsewhere: sticky
    # keeps it on the holder; skipping the filter (exploration) lets token load move it
    eps = [endpoint(0, pending_prefill_tokens=10_000), endpoint(1)]
    assert decide("llm-d-sticky", req, eps, {"pod-0": 512}).endpoint_id == "pod-0"
    explore = {"affinity": {"exploration_probability": 1.0}}
    assert decide("llm-d-sticky", req, eps, {"pod-0": 512}, params=explore).endpoint_id == "pod-1"


# -- gie-weighted -----------------------------------------------------------------------------


def test_gie_weights_prefix_3_queue_2_kv_2() -> None:
    # The holder has the longest waiting queue (queue score 0); the others are idle (score 1).
    # holder total = (3 x 1 + 2 x 0 + 2 x (1 - u)) / 7, an idle pod's = (0 + 2 + 2) / 7:
    # the holder wins while its KV usage u < 0.5.
    req = request(4096)
    for usage, expected in [(0.4, "pod-0"), (0.6, "pod-1")]:
        eps = [endpoint(0, engine=engine(waiting=5, usage=usage)), endpoint(1, engine=engine())]
        d = decide("gie-weighted", req, eps, {"pod-0": 256})
        assert d.endpoint_id == expected, usage
        holder = next(c for c in d.candidates if c.estimate.endpoint_id == "pod-0")
        assert holder.total_score == pytest.approx((3 + 2 * (1 - usage)) / 7)


def test_gie_prefix_counts_only_the_first_256_blocks() -> None:
    # A 16k-token prompt (1000 blocks): pod-0 holds the first 300, pod-1 900. GIE sees both as
    # full matches (the prompt is cut at 256 blocks), so the shorter queue wins; kvgate's
    # `prefix` policy takes the longest match. Queue scores (min-max of 2, 3, 4): 1, 0.5, 0.
    req = request(16_000)
    eps = [
        endpoint(0, engine=engine(waiting=2)),
        endpoint(1, engine=engine(waiting=3)),
        endpoint(2, engine=engine(waiting=4)),
    ]
    matched = {"pod-0": 300, "pod-1": 900}
    assert decide("gie-weighted", req, eps, matched).endpoint_id == "pod-0"
    assert decide("prefix", req, eps, matched).endpoint_id == "pod-1"
    # matching all 1000 blocks: pod-0 (0.3 x 3 + 2 + 2) / 7 < pod-1 (0.9 x 3 + 1 + 2) / 7
    whole = {"prefix": {"max_prefix_blocks_to_match": 1000}}
    assert decide("gie-weighted", req, eps, matched, params=whole).endpoint_id == "pod-1"


def test_waiting_queue_is_min_max_scaled_engine_waiting() -> None:
    eps = [
        endpoint(0, engine=engine(waiting=2)),
        endpoint(1, engine=engine(waiting=6)),
        endpoint(2, engine=engine(waiting=4)),
        endpoint(3, pending_prefill_requests=6),  # never scraped: the router's pending count
    ]
    state = cycle_state(request(), eps, {})
    assert WaitingQueueScorer().score(state, eps) == [1.0, 0.0, 0.5, 0.0]
    assert WaitingQueueScorer().score(state, eps[:1]) == [1.0]


# -- dynamo-kv --------------------------------------------------------------------------------


def test_dynamo_cost_is_overlap_weight_times_prefill_blocks_plus_decode_blocks() -> None:
    req = request(8000)  # 500 blocks of 16 tokens
    eps = [
        endpoint(0, pending_prefill_tokens=1600, engine=engine(usage=0.1)),
        endpoint(1),
    ]
    state = cycle_state(req, eps, {"pod-0": 200})
    scorer = KvBlockCostScorer()
    # pod-0: prefill (1600 + 8000 - 200 x 16) / 16 = 400; decode 0.1 x 24626 + 1600/16 + 300
    assert scorer.cost_blocks(state, eps[0]) == pytest.approx(400 + 2462.6 + 100 + 300)
    # pod-1: prefill 500, decode 0 + 500
    assert scorer.cost_blocks(state, eps[1]) == pytest.approx(1000)
    assert scorer.score(state, eps) == [0.0, 1.0]
    weighted = KvBlockCostScorer(scorer.params.model_copy(update={"overlap_score_weight": 2}))
    assert weighted.cost_blocks(state, eps[1]) == pytest.approx(1500)


def test_dynamo_prefers_the_holder_until_its_active_blocks_cost_more_than_a_prefill() -> None:
    req = request(8192)  # 512 blocks; on an idle pod: 512 prefill + 512 decode = 1024
    for usage, expected in [(0.02, "pod-0"), (0.1, "pod-1")]:  # 492 vs 2463 active blocks
        eps = [endpoint(0, engine=engine(usage=usage)), endpoint(1, engine=engine())]
        d = decide("dynamo-kv", req, eps, {"pod-0": 512})
        assert d.endpoint_id == expected, usage
    # overlap weight 0 drops the prefill term: the holder's 739 active blocks now cost more
    # than the idle pod's 512 new blocks (Dynamo: "pure load balancing")
    eps = [endpoint(0, engine=engine(usage=0.03)), endpoint(1, engine=engine())]
    assert decide("dynamo-kv", req, eps, {"pod-0": 512}).endpoint_id == "pod-0"
    no_overlap = {"cost": {"overlap_score_weight": 0}}
    assert decide("dynamo-kv", req, eps, {"pod-0": 512}, params=no_overlap).endpoint_id == "pod-1"


def test_softmax_samples_exp_of_scaled_scores_over_temperature() -> None:
    picker = SoftmaxPicker(SoftmaxParams(temperature=1.0))
    # scores scaled to [0, 1]: [1, 0, 0.5] -> weights e^0, e^-1, e^-0.5
    probs = picker.probabilities([0.9, 0.1, 0.5])
    weights = [1.0, math.exp(-1), math.exp(-0.5)]
    assert probs == pytest.approx([w / sum(weights) for w in weights])
    assert picker.probabilities([0.3, 0.3]) == [0.5, 0.5]
    eps = fleet(3)
    state_seeds = range(3000)
    counts = Counter(
        picker.pick(cycle_state(request(), eps, {}, seed=s), eps, [0.9, 0.1, 0.5]).id
        for s in state_seeds
    )
    for e, p in zip(eps, probs, strict=True):
        assert counts[e.id] / 3000 == pytest.approx(p, abs=0.03)


def test_dynamo_temperature_zero_is_argmin_and_higher_temperatures_spread() -> None:
    req = request(8192)
    # costs: pod-0 512 + 512 = 1024; pod-1 holds it all, 0.03 x 24626 = 739 active blocks;
    # pod-2 2463 active blocks + 1024
    eps = [
        endpoint(0),
        endpoint(1, engine=engine(usage=0.03)),
        endpoint(2, engine=engine(usage=0.1)),
    ]
    matched = {"pod-1": 512}
    cold = Counter(decide("dynamo-kv", req, eps, matched, seed=s).endpoint_id for s in range(50))
    assert cold == {"pod-1": 50}
    hot = {"sampling": {"temperature": 10.0}}
    spread = Counter(
        decide("dynamo-kv", req, eps, matched, seed=s, params=hot).endpoint_id for s in range(300)
    )
    assert len(spread) == 3 and max(spread.values()) < 150


# -- load-aware -------------------------------------------------------------------------------


def test_load_aware_score_is_match_minus_beta_relative_load() -> None:
    req = request(4096)
    eps = [endpoint(0, in_flight=4), endpoint(1, in_flight=2), endpoint(2, in_flight=0)]
    state = cycle_state(req, eps, {"pod-0": 255})  # 4080 of 4096 tokens held
    raw = MatchMinusLoadScorer().raw_scores(state, eps)
    # mean load 2: pod-0 = 4080/4096 - (4 - 2)/2, pod-1 = 0 - 0, pod-2 = 0 - (0 - 2)/2
    assert raw == pytest.approx([4080 / 4096 - 1.0, 0.0, 1.0])
    assert decide("load-aware", req, eps, {"pod-0": 255}).endpoint_id == "pod-2"
    # a holder at the mean load wins; beta 0 is pure prefix affinity
    even = [endpoint(i, in_flight=2) for i in range(3)]
    assert decide("load-aware", req, even, {"pod-0": 255}).endpoint_id == "pod-0"
    greedy = decide("load-aware", req, eps, {"pod-0": 255}, params={"score": {"beta": 0}})
    assert (greedy.endpoint_id, greedy.reason) == ("pod-0", "prefix-hit")


# -- aibrix-prefix ----------------------------------------------------------------------------


def test_aibrix_best_match_within_one_stddev_of_the_mean_load() -> None:
    req = request(4096)
    # loads 3, 1, 1, 1: mean 1.5, sample stddev 1.0 -> bound 2.5; the holder at 3 is over it
    eps = [endpoint(0, in_flight=3)] + [endpoint(i, in_flight=1) for i in (1, 2, 3)]
    d = decide("aibrix-prefix", req, eps, {"pod-0": 256, "pod-1": 100})
    assert d.endpoint_id == "pod-1"  # the best holder within the bound
    assert d.reason == "load-bound"
    dropped = {c.estimate.endpoint_id: c.dropped_by for c in d.candidates}
    assert dropped["pod-0"] == "load-stddev"
    # loads 2, 2, 1, 1: mean 1.5, stddev 0.58 -> bound 2.08; the holder at 2 wins
    eps[0] = endpoint(0, in_flight=2)
    eps[1] = endpoint(1, in_flight=2)
    assert decide("aibrix-prefix", req, eps, {"pod-0": 256, "pod-1": 100}).endpoint_id == "pod-0"


def test_aibrix_equal_match_percent_goes_to_the_lower_load() -> None:
    req = request(10_000)
    eps = [endpoint(0, in_flight=2), endpoint(1, in_flight=1), endpoint(2, in_flight=1)]
    # 6000 vs 6080 tokens held: 60 % for both, so the request count decides
    d = decide("aibrix-prefix", req, eps, {"pod-0": 380, "pod-1": 375})
    assert d.endpoint_id == "pod-1"


def test_aibrix_severe_imbalance_restricts_to_the_least_loaded_pods() -> None:
    req = request(4096)
    # loads 20, 0, 5, 5: mean 7.5, 20 > 2 x 8.5 and 20 - 0 >= 8 -> only pod-1 may take it
    loads = [20, 0, 5, 5]
    eps = [endpoint(i, in_flight=load) for i, load in enumerate(loads)]
    d = decide("aibrix-prefix", req, eps, {"pod-2": 256})
    assert (d.endpoint_id, d.reason) == ("pod-1", "load-bound")
    assert {c.dropped_by for c in d.candidates if c.estimate.endpoint_id != "pod-1"} == {
        "load-imbalance"
    }
    # a gap of 7 is not severe: the holder (within mean + stddev) keeps the request
    eps = [endpoint(i, in_flight=load) for i, load in enumerate([7, 0, 5, 5])]
    assert decide("aibrix-prefix", req, eps, {"pod-2": 256}).endpoint_id == "pod-2"
