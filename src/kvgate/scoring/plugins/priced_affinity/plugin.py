"""``priced-affinity`` filter: keep a request on the pods holding its prompt while waiting there
costs less than a multiple of recomputing it.

1. A candidate is a *holder* when it holds at least ``affinity_threshold`` of the request's
   blocks (the stickiness rule of llm-d's default, ``prefix-cache-affinity``).
2. No holder, or every candidate a holder: keep every candidate.
3. Price the move, with the cost model's estimates (one prefill rate per pool): the best holder
   *h* (lowest predicted queue) against the best other pod *o*. The move saves the queue
   difference ``q_h - q_o`` and costs the recompute ``s = prefill_o - prefill_h`` (the tokens *h*
   holds and *o* must compute). Keep only the holders while

       q_h - q_o <= stickiness x s

   otherwise keep everyone (the scorer then chooses, usually a non-holder: ``load-spill``).

Why a multiple above 1: recomputing a prefix on another pod is not only this request's cost. It
is prefill capacity the whole pool loses (everyone queued there waits for it) and a second copy
of the prefix in the pool's cache (evicting something else), and the next requests of the same
prefix split between two holders. llm-d expresses stickiness as a fixed threshold of queued
tokens (18 s at its peak rate, whatever the prompt); pricing it in units of the hit keeps a 100k
token history sticky for seconds and lets a 2k-token system prompt replicate within a fraction of
a second, both bounded by the ``affinity-cap`` guard in front of it. It never empties its input.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.block_counts import split_holders
from kvgate.scoring.params import StrictParams


class PricedAffinityParams(StrictParams):
    affinity_threshold: float = Field(default=0.8, ge=0, le=1)
    """Share of the request's blocks a pod must hold to be a holder; 0 = off."""
    stickiness: float = Field(default=8.0, ge=0)
    """Queue delay a holder may add over the best other pod, in units of the recompute the move
    would cost; 0 = move as soon as another pod's queue is shorter."""


class PricedAffinityFilter:
    name = "priced-affinity"
    reason: str | None = None  # never empties its input; moves are the scorer's (`load-spill`)

    def __init__(self, params: PricedAffinityParams | None = None) -> None:
        self.params = params or PricedAffinityParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        p = self.params
        if len(candidates) <= 1 or p.affinity_threshold <= 0:
            return candidates
        holders, others = split_holders(state, candidates, p.affinity_threshold)
        if not holders or not others:
            return candidates
        est = state.estimates
        h = min((est[e.id] for e in holders), key=lambda x: x.queue_seconds)
        o = min((est[e.id] for e in others), key=lambda x: x.queue_seconds)
        recompute = o.prefill_seconds - h.prefill_seconds
        if h.queue_seconds - o.queue_seconds <= p.stickiness * max(recompute, 0.0):
            return holders
        return candidates
