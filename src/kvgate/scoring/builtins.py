"""Registers every built-in plugin and policy into a :class:`~kvgate.scoring.registry.PluginRegistry`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgate.scoring.cost_model import CostModel
from kvgate.scoring.pipeline import PipelinePolicy, WeightedScorer
from kvgate.scoring.plugins.affinity_cap import AffinityCapFilter, AffinityCapParams
from kvgate.scoring.plugins.healthy import HealthyFilter, HealthyParams
from kvgate.scoring.plugins.kv_cache_usage import KvCacheUsageParams, KvCacheUsageScorer
from kvgate.scoring.plugins.load_bound import LoadBoundFilter, LoadBoundParams
from kvgate.scoring.plugins.near_equal import NearEqualParams, NearEqualPicker
from kvgate.scoring.plugins.predicted_ttft import PredictedTtftParams, PredictedTtftScorer
from kvgate.scoring.plugins.prefix_cache import PrefixCacheParams, PrefixCacheScorer
from kvgate.scoring.plugins.queue_depth import QueueDepthParams, QueueDepthScorer
from kvgate.scoring.plugins.round_robin import RoundRobinParams, RoundRobinPicker
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
    r.add_filter("affinity-cap", AffinityCapParams, AffinityCapFilter, "cap predicted queue wait")
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

    def pipeline(params: PipelineParams) -> PipelinePolicy:
        return PipelinePolicy(
            "pipeline",
            cost_model=CostModel(params.cost_model),
            filters=[r.filter(f.name, f.params) for f in params.filters],
            scorers=[WeightedScorer(r.scorer(s.name, s.params), s.weight) for s in params.scorers],
            picker=r.picker(params.picker.name, params.picker.params),
            no_hit_reason=params.no_hit_reason,
        )

    r.add_policy("pipeline", PipelineParams, pipeline, "filters, weighted scorers, picker by name")
