"""``near-equal`` picker: best total score, with randomised choice among near-equal candidates.

The near-equal set is every candidate whose total score is at least ``(1 - tolerance)`` x the
best. One of them is chosen by ``tie_break``:

- ``random``: uniformly, from the injected rng (bursts and several router replicas that see
  the same state do not all herd onto the same pod);
- ``least-recent``: the one this router chose least recently (ties: random);
- ``least-load``: the one with the fewest requests (ties: random);
- ``least-turnover``: the one with the fewest requests and, among those, once every one reports
  a KV cache that has filled, the one this router sent the fewest uncached prompt tokens lately
  for its cache's size (``ChoiceHistory.recent_uncached_tokens``): vLLM evicts the least
  recently used block first, so the new blocks there evict the ones used longest ago (ties, or
  a pod whose cache has not filled or that reports no size: random).

When no candidate in the near-equal set holds any of the prompt (no prefix hit), ``no_hit_tie_break``
applies instead (default: same as ``tie_break``): spreading cold requests by recency keeps one
pod from collecting every new session while the others idle.

When every candidate in the near-equal set holds some of the prompt but less than
``partial_hit_share`` of it, and computes the rest within ``partial_hit_max_prefill_seconds``,
``partial_hit_tie_break`` applies (default: same as ``tie_break``). Such a request starts a new
context on a shared head (a new conversation on a system prompt every pod holds): where it
lands is where its later turns will go, so the pick places future load, not only this
request's. A long rest is a cold prefill in all but name, and is picked as one: with
``partial_hit_tie_break`` set, when every candidate holds less than ``partial_hit_share`` of the
prompt and computes the rest in longer than ``partial_hit_max_prefill_seconds``,
``no_hit_tie_break`` applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

from pydantic import Field

from kvgate.scoring.base import CostEstimate, CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams

TieBreak = Literal["random", "least-recent", "least-load", "least-turnover"]
T = TypeVar("T")


class NearEqualParams(StrictParams):
    tolerance: float = Field(default=0.0, ge=0, lt=1)
    """Relative: candidates scoring >= (1 - tolerance) x best are near-equal."""
    tie_break: TieBreak = "random"
    no_hit_tie_break: TieBreak | None = None
    partial_hit_tie_break: TieBreak | None = None
    partial_hit_share: float = Field(default=0.8, ge=0, le=1)
    """A hit below this share of the prompt is partial (``partial_hit_tie_break`` applies)."""
    partial_hit_max_prefill_seconds: float = Field(default=0.25, ge=0)
    """A partial hit whose rest is predicted to prefill for longer is picked like a cold one."""


class NearEqualPicker:
    name = "near-equal"

    def __init__(self, params: NearEqualParams | None = None) -> None:
        self.params = params or NearEqualParams()

    def pick(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot], totals: Sequence[float]
    ) -> EndpointSnapshot:
        near = self._near(candidates, totals)
        if len(near) == 1:
            return near[0]
        est = state.estimates
        mode = self._mode([est[e.id] for e in near])
        if mode == "least-recent":
            last = state.history.last_chosen
            oldest = min(last(e.id) for e in near)
            near = [e for e in near if last(e.id) == oldest]
        elif mode in ("least-load", "least-turnover"):
            lowest = min(est[e.id].load for e in near)
            near = [e for e in near if est[e.id].load == lowest]
            if mode == "least-turnover" and len(near) > 1:
                near = _slowest_turnover(state, near)
        if len(near) == 1:
            return near[0]
        return near[state.rng.randrange(len(near))]

    def tie_break(self, estimates: Sequence[CostEstimate], totals: Sequence[float]) -> str | None:
        """The rule :meth:`pick` applies to candidates with these estimates and totals."""
        near = self._near(estimates, totals)
        return self._mode(near) if len(near) > 1 else None

    def _near(self, items: Sequence[T], totals: Sequence[float]) -> list[T]:
        """The items whose total is within ``tolerance`` of the best (same order as totals)."""
        threshold = max(totals) * (1.0 - self.params.tolerance) - 1e-12
        return [item for item, t in zip(items, totals, strict=True) if t >= threshold]

    def _mode(self, near: Sequence[CostEstimate]) -> TieBreak:
        p = self.params
        if not any(e.hit_tokens for e in near):
            return p.no_hit_tie_break or p.tie_break
        if p.partial_hit_tie_break is None or not all(
            e.hit_tokens < p.partial_hit_share * (e.hit_tokens + e.uncached_tokens) for e in near
        ):
            return p.tie_break
        long_rests = sum(e.prefill_seconds > p.partial_hit_max_prefill_seconds for e in near)
        if long_rests == 0:
            return p.partial_hit_tie_break
        if long_rests == len(near):
            return p.no_hit_tie_break or p.tie_break
        return p.tie_break


def _slowest_turnover(state: CycleState, near: list[EndpointSnapshot]) -> list[EndpointSnapshot]:
    """The candidates whose KV cache turns over slowest: the fewest uncached prompt tokens this
    router sent them lately for their cache's size. All of them unless every one reports a
    cache that has filled (until then, a pod's new blocks need not evict anything)."""
    turnover = []
    for e in near:
        engine = e.engine
        if engine is None or not engine.kv_filled or engine.kv_capacity_tokens <= 0:
            return near
        sent = state.history.recent_uncached_tokens(e.id, state.now)
        turnover.append(sent / engine.kv_capacity_tokens)
    slowest = min(turnover)
    return [e for e, t in zip(near, turnover, strict=True) if t == slowest]
