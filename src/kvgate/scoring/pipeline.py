"""A policy as a pipeline: cost model -> filters -> weighted scorers -> picker -> reason.

1. The cost model estimates every endpoint once (:class:`~kvgate.scoring.base.CostEstimate`); the
   estimates go into the :class:`~kvgate.scoring.base.CycleState` every plugin reads.
2. Filters run in order; each endpoint a filter drops is remembered with the filter's name. An
   empty candidate list raises :class:`~kvgate.scoring.base.NoEligibleEndpointError`.
3. Each scorer scores the survivors in [0, 1]; the total is the weighted mean
   (``sum(w * s) / sum(w)``, so it is in [0, 1] too; 1.0 for everyone without scorers).
4. The picker chooses one survivor; the policy's copier, if any, may then propose a copy of
   the request's prefix onto another pod (``Decision.copy``), looking at every endpoint.
5. The reason: the policy's fixed reason if it has one (``round-robin``, ``least-load``); else,
   among endpoints not dropped by a hard filter, if none holds any of the prompt, the policy's
   no-hit reason; if the chosen one holds the longest prefix, ``prefix-hit``; if every holder of
   the longest prefix was dropped by one guard, that guard's reason (``affinity-cap``,
   ``load-bound``); otherwise ``load-spill`` (a holder was there, but another pod scored better).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.scoring.base import (
    REASON_LOAD_SPILL,
    REASON_NO_HIT_SPREAD,
    REASON_PREFIX_HIT,
    ChoiceHistory,
    Copier,
    CycleState,
    Decision,
    EndpointSnapshot,
    Explanation,
    Filter,
    MatchedBlocks,
    NoEligibleEndpointError,
    Picker,
    RoutingRequest,
    Scorer,
)
from kvgate.scoring.cost_model import CostModel


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


class PipelinePolicy:
    """Implements :class:`~kvgate.scoring.base.Policy` from plugins. Immutable after construction."""

    def __init__(
        self,
        name: str,
        *,
        cost_model: CostModel,
        filters: Sequence[Filter],
        scorers: Sequence[WeightedScorer],
        picker: Picker,
        fixed_reason: str | None = None,
        no_hit_reason: str = REASON_NO_HIT_SPREAD,
        counts_inflight_blocks: bool = False,
        copier: Copier | None = None,
    ) -> None:
        if any(not w.weight > 0 for w in scorers):
            raise ValueError("scorer weights must be > 0")
        self.name = name
        self.cost_model = cost_model
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.fixed_reason = fixed_reason
        self.no_hit_reason = no_hit_reason
        self.counts_inflight_blocks = counts_inflight_blocks
        self.copier = copier
        # the router passes the expected output where any scorer prices the decode
        ratios = [getattr(w.scorer, "decode_min_output_ratio", None) for w in self.scorers]
        priced = [r for r in ratios if r is not None]
        self.decode_min_output_ratio = min(priced) if priced else None
        self._guard_reasons = {f.name: f.reason for f in self.filters}
        self._weight_sum = sum(w.weight for w in self.scorers)

    def decide(
        self,
        request: RoutingRequest,
        endpoints: Sequence[EndpointSnapshot],
        matched_blocks: MatchedBlocks,
        *,
        now: float,
        rng: random.Random,
        history: ChoiceHistory,
    ) -> Decision:
        if not endpoints:
            raise NoEligibleEndpointError("no endpoints serve this model")
        estimates = self.cost_model.estimate_all(request, endpoints, matched_blocks)
        state = CycleState(
            request=request,
            matched_blocks=matched_blocks,
            now=now,
            rng=rng,
            history=history,
            estimates=estimates,
            max_hit_tokens=max(e.hit_tokens for e in estimates.values()),
        )
        dropped: dict[str, str] = {}
        candidates: Sequence[EndpointSnapshot] = endpoints
        for f in self.filters:
            kept = f.filter(state, candidates)
            if len(kept) != len(candidates):
                kept_ids = {e.id for e in kept}
                for e in candidates:
                    if e.id not in kept_ids:
                        dropped[e.id] = f.name
                candidates = kept
                if not candidates:
                    raise NoEligibleEndpointError(f"no endpoint passed the {f.name!r} filter")
        per_scorer = [(w, w.scorer.score(state, candidates)) for w in self.scorers]
        if len(per_scorer) == 1:  # the weighted mean of one score is the score
            totals = per_scorer[0][1]
        elif per_scorer:
            totals = [
                sum(w.weight * scores[i] for w, scores in per_scorer) / self._weight_sum
                for i in range(len(candidates))
            ]
        else:
            totals = [1.0] * len(candidates)
        chosen = self.picker.pick(state, candidates, totals)

        est = estimates[chosen.id]
        return Decision(
            endpoint_id=chosen.id,
            pool=chosen.pool,
            reason=self._reason(endpoints, state, dropped, est.hit_tokens),
            policy=self.name,
            predicted_hit_tokens=est.hit_tokens,
            predicted_ttft_seconds=est.ttft_seconds,
            copy=None if self.copier is None else self.copier.copy(state, endpoints, chosen),
            explanation=Explanation(
                estimates=estimates,
                dropped=dropped,
                survivors=tuple(e.id for e in candidates),
                scores={w.scorer.name: s for w, s in per_scorer},
                totals=totals,
                prefix_sharers=request.prefix_sharers,
                batch_waiting=request.batch_waiting,
                picker=self.picker,
                endpoints=endpoints,
            ),
        )

    def _reason(
        self,
        endpoints: Sequence[EndpointSnapshot],
        state: CycleState,
        dropped: dict[str, str],
        chosen_hit: int,
    ) -> str:
        if self.fixed_reason is not None:
            return self.fixed_reason
        if state.max_hit_tokens == 0:  # nobody holds anything (usable or not)
            return self.no_hit_reason
        if chosen_hit >= state.max_hit_tokens:
            return REASON_PREFIX_HIT
        est = state.estimates
        guards = self._guard_reasons
        relevant = [e for e in endpoints if e.id not in dropped or guards[dropped[e.id]]]
        best_hit = max((est[e.id].hit_tokens for e in relevant), default=0)
        if best_hit == 0:
            return self.no_hit_reason
        if chosen_hit >= best_hit:
            return REASON_PREFIX_HIT
        holders = [e for e in relevant if est[e.id].hit_tokens == best_hit]
        by = {dropped.get(e.id) for e in holders}
        if len(by) == 1:
            (only,) = by
            if only is not None:
                return guards[only] or REASON_LOAD_SPILL
        return REASON_LOAD_SPILL
