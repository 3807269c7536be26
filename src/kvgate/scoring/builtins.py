"""Registers every built-in plugin and policy into a :class:`~kvgate.scoring.registry.PluginRegistry`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgate.scoring.cost_model import CostModel
from kvgate.scoring.peer_policies import (
    AibrixPrefixParams,
    DynamoKvParams,
    GieWeightedParams,
    LlmdStickyParams,
    LoadAwareParams,
    aibrix_prefix_policy,
    dynamo_kv_policy,
    gie_weighted_policy,
    llmd_sticky_policy,
    load_aware_policy,
)
from kvgate.scoring.pipeline import PipelinePolicy, WeightedScorer
from kvgate.scoring.plugins.affinity_cap import AffinityCapFilter, AffinityCapParams
from kvgate.scoring.plugins.class_isolation import ClassIsolationFilter, ClassIsolationParams
from kvgate.scoring.plugins.gie_prefix import GiePrefixParams, GiePrefixScorer
from kvgate.scoring.plugins.healthy import HealthyFilter, HealthyParams
from kvgate.scoring.plugins.holder_load import HolderLoadFilter, HolderLoadParams
from kvgate.scoring.plugins.kv_block_cost import KvBlockCostParams, KvBlockCostScorer
from kvgate.scoring.plugins.kv_cache_usage import KvCacheUsageParams, KvCacheUsageScorer
from kvgate.scoring.plugins.load_bound import LoadBoundFilter, LoadBoundParams
from kvgate.scoring.plugins.load_imbalance import LoadImbalanceFilter, LoadImbalanceParams
from kvgate.scoring.plugins.load_stddev import LoadStddevFilter, LoadStddevParams
from kvgate.scoring.plugins.match_minus_load import MatchMinusLoadParams, MatchMinusLoadScorer
from kvgate.scoring.plugins.match_percent import MatchPercentParams, MatchPercentScorer
from kvgate.scoring.plugins.near_equal import NearEqualParams, NearEqualPicker
from kvgate.scoring.plugins.predicted_ttft import PredictedTtftParams, PredictedTtftScorer
from kvgate.scoring.plugins.prefix_affinity import PrefixAffinityFilter, PrefixAffinityParams
from kvgate.scoring.plugins.prefix_cache import PrefixCacheParams, PrefixCacheScorer
from kvgate.scoring.plugins.queue_depth import QueueDepthParams, QueueDepthScorer
from kvgate.scoring.plugins.round_robin import RoundRobinParams, RoundRobinPicker
from kvgate.scoring.plugins.softmax import SoftmaxParams, SoftmaxPicker
from kvgate.scoring.plugins.token_load import TokenLoadParams, TokenLoadScorer
from kvgate.scoring.plugins.waiting_queue import WaitingQueueParams, WaitingQueueScorer
from kvgate.scoring.policies import (
    BaselineParams,
    KvgateParams,
    PipelineParams,
    kvgate_policy,
    least_load_policy,
    prefix_policy,
    round_robin_policy,
)

if TYPE_CHECKING:
    from kvgate.scoring.registry import PluginRegistry


def register_builtins(registry: PluginRegistry) -> None:
    r = registry
    r.add_filter("healthy", HealthyParams, HealthyFilter, "drop unhealthy or draining pods")
    r.add_filter("load-bound", LoadBoundParams, LoadBoundFilter, "no pod above c x mean load")
    r.add_filter("holder-load", HolderLoadParams, HolderLoadFilter, "hot prefix holders spill")
    r.add_filter("affinity-cap", AffinityCapParams, AffinityCapFilter, "cap predicted queue wait")
    r.add_filter(
        "class-isolation", ClassIsolationParams, ClassIsolationFilter, "online off borrowed pods"
    )
    r.add_scorer("prefix-cache", PrefixCacheParams, PrefixCacheScorer, "share of prompt cached")
    r.add_scorer("queue-depth", QueueDepthParams, QueueDepthScorer, "fewer requests is better")
    r.add_scorer("kv-cache-usage", KvCacheUsageParams, KvCacheUsageScorer, "1 - KV cache usage")
    r.add_scorer("predicted-ttft", PredictedTtftParams, PredictedTtftScorer, "lower TTFT is better")
    r.add_picker("near-equal", NearEqualParams, NearEqualPicker, "best, random among near-equal")
    r.add_picker("round-robin", RoundRobinParams, RoundRobinPicker, "least recently chosen")
    r.add_policy("round-robin", BaselineParams, round_robin_policy, "rotate over healthy pods")
    r.add_policy("least-load", BaselineParams, least_load_policy, "fewest requests")
    r.add_policy("prefix", BaselineParams, prefix_policy, "longest prefix match, ties by load")
    r.add_policy("kvgate", KvgateParams, kvgate_policy, "minimise predicted TTFT, with guards")
    _register_peers(r)

    def pipeline(params: PipelineParams) -> PipelinePolicy:
        return PipelinePolicy(
            "pipeline",
            cost_model=CostModel(params.cost_model),
            filters=[r.filter(f.name, f.params) for f in params.filters],
            scorers=[WeightedScorer(r.scorer(s.name, s.params), s.weight) for s in params.scorers],
            picker=r.picker(params.picker.name, params.picker.params),
            no_hit_reason=params.no_hit_reason,
            counts_inflight_blocks=params.inflight_blocks,
        )

    r.add_policy("pipeline", PipelineParams, pipeline, "filters, weighted scorers, picker by name")


def _register_peers(r: PluginRegistry) -> None:
    """The peers' plugins and policies (re-implementations, see peer_policies.py)."""
    r.add_filter(
        "prefix-cache-affinity", PrefixAffinityParams, PrefixAffinityFilter, "llm-d: holders only"
    )
    r.add_filter("load-imbalance", LoadImbalanceParams, LoadImbalanceFilter, "AIBrix load gate")
    r.add_filter("load-stddev", LoadStddevParams, LoadStddevFilter, "AIBrix: load <= mean + k sd")
    r.add_scorer("token-load", TokenLoadParams, TokenLoadScorer, "llm-d: queued prefill tokens")
    r.add_scorer("gie-prefix-cache", GiePrefixParams, GiePrefixScorer, "GIE: share of 256 blocks")
    r.add_scorer("waiting-queue", WaitingQueueParams, WaitingQueueScorer, "GIE: engine waiting")
    r.add_scorer("kv-block-cost", KvBlockCostParams, KvBlockCostScorer, "Dynamo: block cost")
    r.add_scorer(
        "match-minus-load", MatchMinusLoadParams, MatchMinusLoadScorer, "match - beta x load"
    )
    r.add_scorer("match-percent", MatchPercentParams, MatchPercentScorer, "AIBrix: match percent")
    r.add_picker("softmax", SoftmaxParams, SoftmaxPicker, "Dynamo: softmax over scores")
    r.add_policy(
        "llm-d-sticky", LlmdStickyParams, llmd_sticky_policy, "llm-d: sticky until saturated"
    )
    r.add_policy(
        "gie-weighted", GieWeightedParams, gie_weighted_policy, "GIE: prefix 3, queue 2, kv 2"
    )
    r.add_policy("dynamo-kv", DynamoKvParams, dynamo_kv_policy, "Dynamo: prefill + decode blocks")
    r.add_policy("load-aware", LoadAwareParams, load_aware_policy, "production-stack loadaware")
    r.add_policy("aibrix-prefix", AibrixPrefixParams, aibrix_prefix_policy, "AIBrix prefix-cache")
