"""The built-in policies, as pipelines of plugins, with their typed parameters.

- ``round-robin``: healthy -> the candidate least recently chosen. Baseline.
- ``least-load``: healthy -> ``queue-depth`` -> fewest requests (ties random). Baseline.
- ``prefix``: healthy -> ``prefix-cache`` -> longest match; ties by load, then random. What the
  simplest cache-aware routers do; it piles a hot prefix onto one pod.
- ``kvgate`` (default): healthy -> ``affinity-cap`` -> ``class-isolation`` -> ``holder-load``
  -> ``prefix-cache-affinity`` -> ``predicted-ttft`` -> ``near-equal``, over matches that include
  the blocks of the router's requests in flight (``inflight_blocks``). A request never waits in a
  queue longer than ``max_affinity_wait_seconds`` while a pod within it would answer sooner, an
  online request leaves the pods batch work borrowed when that costs it little, a holder of its
  prefix running far more requests than the least-loaded pod takes no more of it (a hot prefix
  with short suffixes queues no prefill there, so nothing else sees the load; a long one, a
  shared document, stays there and the decision proposes to copy it to the least-loaded pod
  by a request of the router's own, ``Decision.copy``), a request stays
  on the pods holding most of its prompt (``affinity.affinity_threshold`` of its blocks) until
  they are saturated (llm-d's "sticky until saturated" rule, with its defaults), and among what is left
  goes where the predicted TTFT (queue delay + prefill of the tokens the pod lacks) plus
  ``work_weight`` x the prefill work itself (which others queue behind) is lowest; near-equal
  costs (within ``tolerance``) go to the pod with the fewest requests, ties at random: with a
  hit, so requests that every pod holds spread by load instead of piling up at random; without
  one, because a cold prefill stalls the decodes of every request beside it (by recency instead,
  end-to-end time was 8-10% longer on the Mooncake trace, docs/scoring.md). A request every pod
  holds only the head of (a new session on a shared system prompt) with a short rest goes to
  the pod chosen least recently: its later turns will follow it there. The cost also prices
  the first tokens a prefill delays (``pending_weight``): each request on the pod still
  waiting for its first token x the time of the prefill's first chunk. Optional: a
  bounded-load guard (``load_bound``: no pod above c x mean load) and a price on the decode
  stall a prefill causes to the requests beside it (``interference_weight``); both are off by
  default: on the benchmark workloads they gave away cache hits (docs/scoring.md).
- ``pipeline``: any filters, weighted scorers and picker from the registry, by name.

Every policy carries a ``cost_model`` so that its decisions can be explained (``/debug/route``)
in the same terms, even when it does not use the costs to choose.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kvgate.scoring.base import (
    REASON_LEAST_LOAD,
    REASON_NO_HIT_SPREAD,
    REASON_ROUND_ROBIN,
)
from kvgate.scoring.cost_model import CostModel, CostModelParams
from kvgate.scoring.params import StrictParams
from kvgate.scoring.pipeline import PipelinePolicy, WeightedScorer
from kvgate.scoring.plugins.affinity_cap import AffinityCapFilter, AffinityCapParams
from kvgate.scoring.plugins.class_isolation import ClassIsolationFilter, ClassIsolationParams
from kvgate.scoring.plugins.healthy import HealthyFilter
from kvgate.scoring.plugins.holder_load import HolderLoadFilter, HolderLoadParams
from kvgate.scoring.plugins.load_bound import LoadBoundFilter, LoadBoundParams
from kvgate.scoring.plugins.near_equal.plugin import NearEqualParams, NearEqualPicker, TieBreak
from kvgate.scoring.plugins.predicted_ttft import PredictedTtftParams, PredictedTtftScorer
from kvgate.scoring.plugins.prefix_affinity import PrefixAffinityFilter, PrefixAffinityParams
from kvgate.scoring.plugins.prefix_cache import PrefixCacheScorer
from kvgate.scoring.plugins.queue_depth import QueueDepthScorer
from kvgate.scoring.plugins.round_robin import RoundRobinPicker


class BaselineParams(StrictParams):
    """Parameters of ``round-robin``, ``least-load`` and ``prefix``: only the explaining model."""

    cost_model: CostModelParams = CostModelParams()


class KvgateParams(StrictParams):
    """Parameters of the default ``kvgate`` policy."""

    cost_model: CostModelParams = CostModelParams()
    affinity: PrefixAffinityParams = PrefixAffinityParams()
    """Stickiness (llm-d's rule and defaults): the pods holding at least ``affinity_threshold``
    of the request's blocks keep it until their queued prefill exceeds the others' by
    ``peak_prefill_tokens_per_second`` x ``max_ttft_penalty_ms``."""
    max_affinity_wait_seconds: float = Field(default=5.0, ge=0)
    """Hard cap on predicted queue wait while a pod within it would answer sooner (RoutingPolicy
    maxAffinityWait)."""
    load_bound: LoadBoundParams | None = None
    """Bounded-load guard (no pod above c x mean load); None = off."""
    holder_load: HolderLoadParams | None = HolderLoadParams()
    """A prefix holder far above the least-loaded pod (by ``max_gap_requests`` and
    ``max_ratio``, or by the narrower ``hot_*`` bounds while its requests in flight share the
    prefix, or at ``idle_copy_sharers`` such requests while a pod is idle) takes no more of the
    prefix, which is then copied elsewhere; None = off."""
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    """Candidates whose predicted-TTFT score is within this share of the best are near-equal."""
    work_weight: float = Field(default=1.0, ge=0)
    """Cost = predicted TTFT + work_weight x prefill seconds. Recomputing a prefix elsewhere also
    delays whoever queues behind that work; 0 = greedy per-request TTFT, which under load moves
    sessions off their holders too eagerly (see tests/unit/scoring/test_scoring_dynamics.py)."""
    interference_weight: float = Field(default=0.0, ge=0)
    """Cost += interference_weight x requests already on the pod x prefill seconds: the decode
    stall a prefill causes to the requests running beside it."""
    pending_weight: float = Field(default=1.0, ge=0)
    """Cost += pending_weight x the router's requests on the pod with no first token yet x the
    time of the prefill's first chunk (at most ``cost_model.max_num_batched_tokens``), on the
    candidates that hold the least of the prompt: with chunked prefill they share a step with
    that chunk, and a long cold prefill is kept off the pods where first tokens are due. 0 turns
    it off (the default before December 5, 2026; over three seeds it gave 4% more mean TTFT and
    1-6% more end-to-end time on the conversation-trace shape, docs/scoring.md)."""
    decode_weight: float = Field(default=0.1, ge=0)
    """Cost += decode_weight x the predicted decode slowdown on the pod: the answer's expected
    output tokens (learned from the pool's answers) x the KV cache its requests hold x
    ``cost_model.decode_seconds_per_kv_token``, while some candidate has no prefill queue, in
    pools whose answers are long next to their prompts (``decode_min_output_ratio``). 0 = off
    (the default before December 7, 2026; docs/benchmarks.md, *The decode price where answers
    are long*)."""
    decode_min_output_ratio: float = Field(default=0.3, ge=0)
    """The decode price is charged only in pools whose answers average at least this many
    output tokens per prompt token (a reasoning model's chats: ~0.65 on the thinking-like
    trace; chat, documents and agents 0.01-0.14). Charged in every pool (0), at a weight of
    0.25, it cost 1-10% of TTFT where answers are short (docs/benchmarks.md, *A decode price,
    opt-in*)."""
    ttft_floor_seconds: float = Field(default=0.02, gt=0)
    """See the predicted-ttft scorer: absolute slack so ms-level differences count as equal."""
    tie_break: TieBreak = "least-load"
    """Among near-equal candidates with a hit: the pod with the fewest requests (a random draw
    piles requests that every pod holds onto a few pods; docs/scoring.md)."""
    no_hit_tie_break: TieBreak = "least-turnover"
    """Among near-equal candidates none of which holds any of the prompt: the pod with the
    fewest requests, then, once every such pod's KV cache has filled, the one whose cache turns
    over slowest: what the prompt evicts there was used longest ago (docs/scoring.md)."""
    partial_hit_tie_break: TieBreak = "least-recent"
    """Among near-equal candidates that each hold less than ``affinity.affinity_threshold`` of
    the prompt (a new conversation on a system prompt every pod holds): the pod chosen least
    recently, so that new contexts, and the later turns that follow them, spread evenly; the
    fewest requests now says little about the load those turns will bring (docs/scoring.md)."""
    partial_hit_max_prefill_seconds: float = Field(default=0.25, ge=0)
    """``partial_hit_tie_break`` applies only when the rest of the prompt is predicted to prefill
    within this; a longer rest stalls the decodes beside it like a cold prefill, and is placed
    like one."""
    class_isolation: ClassIsolationParams | None = ClassIsolationParams()
    """Online requests leave pods that batch work borrowed while one without answers within
    ``max_extra_seconds`` of the best, and yield their lightest pod to batch requests waiting to
    borrow one; None = off."""
    inflight_blocks: bool = True
    """Count the prompt blocks of the router's requests in flight on a pod as held there: the
    directory hears of them only once computed, and meanwhile a burst with one new prefix would
    look cold everywhere and recompute it once per pod (docs/router.md, *Cache state*)."""


class PluginRef(StrictParams):
    name: str
    params: dict[str, Any] = {}


class WeightedPluginRef(PluginRef):
    weight: float = Field(default=1.0, gt=0)


class PipelineParams(StrictParams):
    """A policy assembled from registered plugins (Gateway API Inference Extension style)."""

    cost_model: CostModelParams = CostModelParams()
    filters: list[PluginRef] = [PluginRef(name="healthy")]
    scorers: list[WeightedPluginRef] = []
    picker: PluginRef = PluginRef(name="near-equal")
    no_hit_reason: str = REASON_NO_HIT_SPREAD
    inflight_blocks: bool = True
    """Count the blocks of the router's requests in flight as held (see ``KvgateParams``)."""


def round_robin_policy(params: BaselineParams) -> PipelinePolicy:
    return PipelinePolicy(
        "round-robin",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[],
        picker=RoundRobinPicker(),
        fixed_reason=REASON_ROUND_ROBIN,
    )


def least_load_policy(params: BaselineParams) -> PipelinePolicy:
    return PipelinePolicy(
        "least-load",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[WeightedScorer(QueueDepthScorer(), 1.0)],
        picker=NearEqualPicker(NearEqualParams(tie_break="random")),
        fixed_reason=REASON_LEAST_LOAD,
    )


def prefix_policy(params: BaselineParams) -> PipelinePolicy:
    return PipelinePolicy(
        "prefix",
        cost_model=CostModel(params.cost_model),
        filters=[HealthyFilter()],
        scorers=[WeightedScorer(PrefixCacheScorer(), 1.0)],
        picker=NearEqualPicker(NearEqualParams(tie_break="least-load")),
        no_hit_reason=REASON_LEAST_LOAD,
    )


def kvgate_policy(params: KvgateParams) -> PipelinePolicy:
    holder_load = HolderLoadFilter(params.holder_load) if params.holder_load is not None else None
    return PipelinePolicy(
        "kvgate",
        cost_model=CostModel(params.cost_model),
        filters=[
            HealthyFilter(),
            # The cap first: it must see the pods a too-long queue would move the request to.
            AffinityCapFilter(
                AffinityCapParams(max_affinity_wait_seconds=params.max_affinity_wait_seconds)
            ),
            *([LoadBoundFilter(params.load_bound)] if params.load_bound is not None else []),
            *(
                [ClassIsolationFilter(params.class_isolation)]
                if params.class_isolation is not None
                else []
            ),
            *([holder_load] if holder_load is not None else []),
            PrefixAffinityFilter(params.affinity),
        ],
        scorers=[
            WeightedScorer(
                PredictedTtftScorer(
                    PredictedTtftParams(
                        floor_seconds=params.ttft_floor_seconds,
                        work_weight=params.work_weight,
                        interference_weight=params.interference_weight,
                        pending_weight=params.pending_weight,
                        decode_weight=params.decode_weight,
                        decode_min_output_ratio=params.decode_min_output_ratio,
                        chunk_tokens=params.cost_model.max_num_batched_tokens,
                    )
                ),
                1.0,
            )
        ],
        picker=NearEqualPicker(
            NearEqualParams(
                tolerance=params.tolerance,
                tie_break=params.tie_break,
                no_hit_tie_break=params.no_hit_tie_break,
                partial_hit_tie_break=params.partial_hit_tie_break,
                partial_hit_share=params.affinity.affinity_threshold,
                partial_hit_max_prefill_seconds=params.partial_hit_max_prefill_seconds,
            )
        ),
        counts_inflight_blocks=params.inflight_blocks,
        copier=holder_load,
    )
