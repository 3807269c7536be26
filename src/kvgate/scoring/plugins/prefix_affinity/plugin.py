"""``prefix-cache-affinity`` filter: keep a request on its prefix holders until they saturate.

A re-implementation of llm-d's ``prefix-cache-affinity-filter`` (llm-d/llm-d-router,
``pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go``, read 2026;
the filter behind llm-d's "sticky until saturated" default). Algorithm:

1. A candidate is *sticky* when the share of the request's blocks it holds,
   ``matched_blocks / request_blocks``, is at least ``affinity_threshold``.
2. No sticky candidate, a single candidate, or a threshold of 0: keep every candidate.
3. With probability ``exploration_probability`` keep every candidate (exploration; default off).
4. Load gate: each candidate's TTFT is estimated from the prefill work queued on it,
   ``in_flight_tokens / peak_prefill_tokens_per_second``; if the best sticky candidate's
   estimate exceeds the best non-sticky one's by more than ``max_ttft_penalty_ms``, keep every
   candidate (stickiness breaks; the scorers then choose). Otherwise keep only the sticky ones.

The gate is one threshold in tokens, tau = ``peak_prefill_tokens_per_second`` x
``max_ttft_penalty_ms`` / 1000 (defaults: 15,928 tok/s x 18 s = 286,704 tokens): a holder keeps
its requests until it has tau more queued prefill tokens than the least-queued other pod.

Mapping onto kvgate: llm-d's ``InFlightLoad.Tokens`` (the uncached prompt tokens of requests
dispatched and not yet streaming, counted by its ``inflight-load-producer``) is exactly the
snapshot's ``pending_prefill_tokens``; the match is the directory's leading-block count. It never
empties the candidates, so it needs no ``reason``: requests it keeps on holders are
``prefix-hit``, requests the scorers move after a break are ``load-spill``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.block_counts import split_holders
from kvgate.scoring.params import StrictParams


class PrefixAffinityParams(StrictParams):
    """llm-d's defaults (``DefaultConfig`` of the filter)."""

    affinity_threshold: float = Field(default=0.80, ge=0, le=1)
    """Share of the request's blocks a pod must hold to be sticky (llm-d ``affinityThreshold``)."""
    max_ttft_penalty_ms: float = Field(default=18_000.0, ge=0)
    """Break stickiness when the best holder's estimated TTFT exceeds the best other pod's by
    more than this (llm-d ``maxTTFTPenaltyMs``); 0 = always stick."""
    peak_prefill_tokens_per_second: float = Field(default=15_928.0, gt=0)
    """Converts queued prefill tokens to TTFT (llm-d ``peakPrefillThroughput``: Qwen 32B on
    2x H100, TP=2, vLLM 0.19)."""
    exploration_probability: float = Field(default=0.0, ge=0, le=1)
    """Probability of skipping the filter for one request (llm-d ``explorationProbability``)."""

    @property
    def tau_tokens(self) -> float:
        """The gate as queued prefill tokens: peak rate x max penalty."""
        return self.peak_prefill_tokens_per_second * self.max_ttft_penalty_ms / 1000.0


class PrefixAffinityFilter:
    name = "prefix-cache-affinity"
    reason: str | None = None  # never empties its input, never moves a request off a holder

    def __init__(self, params: PrefixAffinityParams | None = None) -> None:
        self.params = params or PrefixAffinityParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        p = self.params
        if len(candidates) <= 1 or p.affinity_threshold <= 0:
            return candidates
        if p.exploration_probability > 0 and state.rng.random() < p.exploration_probability:
            return candidates
        sticky, others = split_holders(state, candidates, p.affinity_threshold)
        if not sticky:
            return candidates
        if p.max_ttft_penalty_ms > 0 and others:
            best_sticky = min(e.pending_prefill_tokens for e in sticky)
            best_other = min(e.pending_prefill_tokens for e in others)
            if best_sticky - best_other > p.tau_tokens:
                return candidates
        return sticky
