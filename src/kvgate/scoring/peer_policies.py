"""Re-implementations of the strongest peer routers' published algorithms, as kvgate policies.

Each is a pipeline of registered plugins with the peer's defaults, so that every benchmark can
run it next to ``kvgate`` on the same fleet, directory and requests (``kvgate bench run
--targets llm-d-sticky,...``, live and ``--mode des``). They are **re-implementations** from the
peers' source and docs (facts and numbers only, no code copied); each plugin's README names its
source and what could not be reproduced.

- ``llm-d-sticky`` (llm-d's current default, "sticky until saturated"): healthy ->
  ``prefix-cache-affinity`` (only pods holding >= 80 % of the request's blocks, until the best of
  them has tau = 15,928 tok/s x 18 s more queued prefill tokens than the best other pod) ->
  ``token-load`` -> max score, ties to the least recently chosen (llm-d rotates ties).
- ``gie-weighted`` (Gateway API Inference Extension / llm-d's earlier default): healthy ->
  ``gie-prefix-cache`` x3 + ``waiting-queue`` x2 + ``kv-cache-usage`` x2 -> max score, random ties.
- ``dynamo-kv`` (NVIDIA Dynamo's KV router): healthy -> ``kv-block-cost`` (overlap weight x
  prefill blocks + decode blocks, lowest wins) -> ``softmax`` (temperature 0 = argmin).
- ``load-aware`` (vLLM production-stack ``loadaware``): healthy -> ``match-minus-load``
  (match - beta x relative load, beta 1) -> max score, random ties.
- ``aibrix-prefix`` (AIBrix ``prefix-cache``): healthy -> ``load-imbalance`` (least-loaded pods
  only when max > 2 (mean + 1) and max - min >= 8) -> ``load-stddev`` (no pod above mean + 1
  stddev) -> ``match-percent`` -> best match, ties by least load, then random.

When no candidate holds any of the prompt, every one of them reports ``least-load``: each
spreads cold requests by its load signal.
"""

from __future__ import annotations

from pydantic import Field

from kvgate.scoring.base import REASON_LEAST_LOAD
from kvgate.scoring.cost_model import CostModel, CostModelParams
from kvgate.scoring.params import StrictParams
from kvgate.scoring.pipeline import PipelinePolicy, WeightedScorer
from kvgate.scoring.plugins.gie_prefix import GiePrefixParams, GiePrefixScorer
from kvgate.scoring.plugins.healthy import HealthyFilter
from kvgate.scoring.plugins.kv_block_cost import KvBlockCostParams, KvBlockCostScorer
from kvgate.scoring.plugins.kv_cache_usage import KvCacheUsageParams, KvCacheUsageScorer
from kvgate.scoring.plugins.load_imbalance import LoadImbalanceFilter, LoadImbalanceParams
from kvgate.scoring.plugins.load_stddev import LoadStddevFilter, LoadStddevParams
from kvgate.scoring.plugins.match_minus_load import MatchMinusLoadParams, MatchMinusLoadScorer
from kvgate.scoring.plugins.match_percent import MatchPercentScorer
from kvgate.scoring.plugins.near_equal import NearEqualParams, NearEqualPicker
from kvgate.scoring.plugins.prefix_affinity import PrefixAffinityFilter, PrefixAffinityParams
from kvgate.scoring.plugins.softmax import SoftmaxParams, SoftmaxPicker
from kvgate.scoring.plugins.token_load import TokenLoadParams, TokenLoadScorer
from kvgate.scoring.plugins.waiting_queue import WaitingQueueParams, WaitingQueueScorer


class LlmdStickyParams(StrictParams):
    """``llm-d-sticky``: llm-d's defaults for the affinity filter and the token-load scorer."""

    cost_model: CostModelParams = CostModelParams()
    affinity: PrefixAffinityParams = PrefixAffinityParams()
    token_load: TokenLoadParams = TokenLoadParams()


class GieWeightedParams(StrictParams):
    """``gie-weighted``: GIE's default weights (prefix 3, queue 2, KV-cache utilisation 2)."""

    cost_model: CostModelParams = CostModelParams()
    prefix_weight: float = Field(default=3.0, gt=0)
    queue_weight: float = Field(default=2.0, gt=0)
    kv_cache_weight: float = Field(default=2.0, gt=0)
    prefix: GiePrefixParams = GiePrefixParams()
    queue: WaitingQueueParams = WaitingQueueParams()
    kv_cache: KvCacheUsageParams = KvCacheUsageParams()


class DynamoKvParams(StrictParams):
    """``dynamo-kv``: Dynamo's cost (overlap weight 1) and sampling (temperature 0)."""

    cost_model: CostModelParams = CostModelParams()
    cost: KvBlockCostParams = KvBlockCostParams()
    sampling: SoftmaxParams = SoftmaxParams()


class LoadAwareParams(StrictParams):
    """``load-aware``: production-stack's ``loadaware`` (beta 1)."""

    cost_model: CostModelParams = CostModelParams()
    score: MatchMinusLoadParams = MatchMinusLoadParams()


class AibrixPrefixParams(StrictParams):
    """``aibrix-prefix``: AIBrix's load gate (factor 2, gap 8) and holder check (1 stddev)."""

    cost_model: CostModelParams = CostModelParams()
    imbalance: LoadImbalanceParams = LoadImbalanceParams()
    stddev: LoadStddevParams = LoadStddevParams()


def llmd_sticky_policy(params: LlmdStickyParams) -> PipelinePolicy:
    return PipelinePolicy(
        "llm-d-sticky",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter(), PrefixAffinityFilter(params.affinity)],
        scorers=[WeightedScorer(TokenLoadScorer(params.token_load), 1.0)],
        picker=NearEqualPicker(NearEqualParams(tie_break="least-recent")),
        no_hit_reason=REASON_LEAST_LOAD,
    )


def gie_weighted_policy(params: GieWeightedParams) -> PipelinePolicy:
    return PipelinePolicy(
        "gie-weighted",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[
            WeightedScorer(GiePrefixScorer(params.prefix), params.prefix_weight),
            WeightedScorer(WaitingQueueScorer(params.queue), params.queue_weight),
            WeightedScorer(KvCacheUsageScorer(params.kv_cache), params.kv_cache_weight),
        ],
        picker=NearEqualPicker(NearEqualParams(tie_break="random")),
        no_hit_reason=REASON_LEAST_LOAD,
    )


def dynamo_kv_policy(params: DynamoKvParams) -> PipelinePolicy:
    return PipelinePolicy(
        "dynamo-kv",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[WeightedScorer(KvBlockCostScorer(params.cost), 1.0)],
        picker=SoftmaxPicker(params.sampling),
        no_hit_reason=REASON_LEAST_LOAD,
    )


def load_aware_policy(params: LoadAwareParams) -> PipelinePolicy:
    return PipelinePolicy(
        "load-aware",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[WeightedScorer(MatchMinusLoadScorer(params.score), 1.0)],
        picker=NearEqualPicker(NearEqualParams(tie_break="random")),
        no_hit_reason=REASON_LEAST_LOAD,
    )


def aibrix_prefix_policy(params: AibrixPrefixParams) -> PipelinePolicy:
    return PipelinePolicy(
        "aibrix-prefix",
        cost_model=CostModel(params.cost_model),
        filters=[
            HealthyFilter(),
            LoadImbalanceFilter(params.imbalance),
            LoadStddevFilter(params.stddev),
        ],
        scorers=[WeightedScorer(MatchPercentScorer(), 1.0)],
        picker=NearEqualPicker(NearEqualParams(tie_break="least-load")),
        no_hit_reason=REASON_LEAST_LOAD,
    )
