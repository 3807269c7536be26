"""``holder-load`` guard: a pod holding the request's prefix that runs far more requests than
the least-loaded candidate takes no more of them, so a hot prefix is copied to another pod.

Stickiness (``prefix-cache-affinity``) keeps a request on the pods holding its prefix until
their queued *prefill* tokens run ahead; the predicted-TTFT scorer prices queued prefill too. A
hot prefix with short suffixes queues almost no prefill on its holder, whatever the traffic,
so both keep sending it there while its decode batch grows: every step of that pod reads every
running sequence's context, each of its requests decodes slower, and its end-to-end time grows
several-fold while the other pods idle. This guard is the missing load signal: holders (pods
holding at least ``affinity_threshold`` of the request's blocks) whose load is both more than
``max_gap_requests`` above and more than ``max_ratio`` times the least-loaded candidate's are
dropped, as long as a candidate is left. The request then goes to another holder, or recomputes
the prefix on a pod that then holds it too, until the loads are within the bounds again.

A prefix that is *hot on its holder* (at least ``hot_gap_requests`` of the holder's requests in
flight carry the request's whole matched prefix: a shared system prompt in a stream of short
questions) is copied sooner: its holder is dropped once its load is more than
``hot_gap_requests`` above and ``hot_ratio`` times the least-loaded candidate's, as long as a
pod without the prefix would compute the request within ``hot_max_copy_seconds`` (a shared
document that takes seconds to recompute is copied at the wide bounds only). The copy
splits a stream whose next requests follow it to the new pod, so it pays for its prefill at
once; a session's history (one or two requests in flight carry it) keeps the wide bounds, where
moving it would recompute the prefix to relieve its holder of one request. When every
candidate already holds the prefix there is nothing to copy, and only the wide bounds apply: a
head that every request starts with (one system prompt for a whole conversation trace) makes
every pod hot, and the hot bounds would send a short request to the pods with the fewest
requests whatever their queues. The router counts the sharers from its own requests in flight
(``RoutingRequest.prefix_sharers``); without them only the wide bounds apply.

While a candidate is *idle* (no request in flight or reported), a burst on one prefix is copied
at once: a holder carrying the prefix in ``idle_copy_sharers`` of its requests in flight is
dropped (within ``hot_max_copy_seconds`` as above). The holder of a new prefix is usually still
computing it, and the requests that follow would wait for that prefill, about as long as
computing the prefix on the idle pod; the idle pod gains a copy without delaying anyone, where
the hot bounds would make it later, one pod at a time, while requests queue. One request in
flight on the prefix (a session's next turn, a second request of a group) keeps it.

A prefix hot on its holder whose copy would take longer (``hot_max_copy_seconds``: a shared
document) is *copied in the background* (``background_copies``): the filter keeps the holder,
and ``copy`` proposes, after the pick, to compute the prefix alone on the least-loaded pod that
lacks it (``Decision.copy``; the router sends it as a ``max_tokens: 1`` request, no client
waiting for it, ``kvgate.router.core.prefix_copies``). The prefix's requests stay on the holder
until the copy is there; then the pods share them. Moving a client request instead would make
it, and the burst that follows it (its blocks in flight), wait for seconds of prefill where the
holder answers in a few steps.

The ratio decides only while every candidate runs more than ``max_gap_requests / (max_ratio -
1)`` requests (32 at the defaults; below, the gap is the larger bound): then each pod is busy,
and a move recomputes the prefix with capacity the fleet does not have spare (a hit saves
capacity), so the holder keeps it until it runs twice the least-loaded pod's requests. A pod
with few requests next to a crowded holder is what the gap is for.

Load is max(router in-flight, engine running + waiting), as in ``load-bound``. Unlike that
guard, pods without the prefix are never dropped and both bounds must be exceeded, so loads
that differ by a few requests (the usual spread of sessions and prefix groups) keep their hits.
For an online request the least-loaded pod is sought among the pods that host no batch
request: online traffic gathered on a few pods while batch work borrows the others is what
``class-isolation`` wants, not a pile to spread onto the batch pods.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import REASON_LOAD_BOUND, CycleState, EndpointSnapshot, PrefixCopy
from kvgate.scoring.block_counts import held_blocks, request_blocks, split_holders
from kvgate.scoring.params import StrictParams


class HolderLoadParams(StrictParams):
    affinity_threshold: float = Field(default=0.8, gt=0, le=1)
    """Share of the request's blocks that makes a pod a holder (as ``prefix-cache-affinity``)."""
    max_gap_requests: int = Field(default=32, ge=0)
    """A holder more than this many requests above the least-loaded candidate..."""
    max_ratio: float = Field(default=2.0, ge=1.0)
    """...and above this multiple of its load takes no more of the prefix's requests. It
    decides only while the least-loaded candidate runs more than ``max_gap_requests /
    (max_ratio - 1)`` requests: when every pod is busy, a copy's prefill takes the capacity the
    move was to free, so affinity is kept longer (1.5 until December 6, 2026)."""
    hot_gap_requests: int = Field(default=3, ge=1)
    """A holder with at least this many requests in flight carrying the request's matched prefix,
    more than this many requests above the least-loaded candidate..."""
    hot_ratio: float = Field(default=2.0, ge=1.0)
    """...and above this multiple of its load takes no more of the prefix's requests..."""
    idle_copy_sharers: int = Field(default=2, ge=1)
    """While a candidate is idle, a holder with at least this many requests in flight carrying
    the request's matched prefix takes no more of it (the prefix is copied to the idle pod).
    Above ``hot_gap_requests`` the rule is off (the hot bounds, looser then, apply)."""
    hot_max_copy_seconds: float = Field(default=0.5, ge=0)
    """...while a pod without the prefix would compute the request in at most this long (a
    longer prefix, such as a shared document, is copied in the background, or at the wide
    bounds without ``background_copies``)."""
    background_copies: bool = True
    """A hot prefix longer than ``hot_max_copy_seconds`` to copy is computed on the least-loaded
    pod that lacks it by a request of the router's own, while the holder keeps its requests."""


class HolderLoadFilter:
    name = "holder-load"
    reason: str | None = REASON_LOAD_BOUND

    def __init__(self, params: HolderLoadParams | None = None) -> None:
        self.params = params or HolderLoadParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        if len(candidates) < 2:
            return candidates
        p = self.params
        est = state.estimates
        targets = _targets(state, candidates)
        if not targets:
            return candidates
        least = min(est[e.id].load for e in targets)
        bound = max(least + p.max_gap_requests, p.max_ratio * least)
        hot_sharers, hot_bound = self._hot_bounds(least)
        lowest = min(bound, hot_bound)
        if all(est[e.id].load <= lowest for e in candidates):  # the usual case
            return candidates
        holders, others = split_holders(state, candidates, p.affinity_threshold)
        overloaded = {e.id for e in holders if est[e.id].load > bound}
        sharers = state.request.prefix_sharers
        if sharers:
            hot = {
                e.id
                for e in holders
                if est[e.id].load > hot_bound and sharers.get(e.id, 0) >= hot_sharers
            }
            if (
                hot - overloaded
                and others
                and min(est[e.id].prefill_seconds for e in others) <= p.hot_max_copy_seconds
            ):
                overloaded |= hot
        if not overloaded:
            return candidates
        return [e for e in candidates if e.id not in overloaded]

    def copy(
        self,
        state: CycleState,
        candidates: Sequence[EndpointSnapshot],
        chosen: EndpointSnapshot,
    ) -> PrefixCopy | None:
        """A background copy of the prefix the chosen holder is hot with (see the module
        docstring): to the least-loaded healthy pod of its pool that lacks it, when every such
        pod would take longer than ``hot_max_copy_seconds`` to compute the request (shorter
        copies are made by moving a request: ``filter``). `candidates`: every endpoint given to
        the policy."""
        p = self.params
        sharers = state.request.prefix_sharers
        if not p.background_copies or not sharers or not state.request.copyable:
            return None
        if sharers.get(chosen.id, 0) < min(p.idle_copy_sharers, p.hot_gap_requests):
            return None  # the usual case: not hot by either rule, whatever the loads
        est = state.estimates
        usable = [e for e in candidates if e.healthy and not e.draining and e.pool == chosen.pool]
        if len(usable) < 2:
            return None
        targets = _targets(state, usable)
        if not targets:
            return None
        least = min(est[e.id].load for e in targets)
        hot_sharers, hot_bound = self._hot_bounds(least)
        mine = est[chosen.id]
        if mine.load <= hot_bound or sharers.get(chosen.id, 0) < hot_sharers:
            return None
        total = request_blocks(state.request)
        matched = state.matched_blocks
        depth = held_blocks(matched, chosen.id, total)
        if total <= 0 or depth < p.affinity_threshold * total:
            return None  # not a holder: it was chosen for another reason
        lacking = [
            e for e in targets if held_blocks(matched, e.id, total) < p.affinity_threshold * depth
        ]
        if not lacking or min(est[e.id].prefill_seconds for e in lacking) <= p.hot_max_copy_seconds:
            return None
        target = min(lacking, key=lambda e: (est[e.id].load, est[e.id].queue_seconds))
        t = est[target.id]
        tokens = (depth - held_blocks(matched, target.id, total)) * state.request.block_tokens
        rate = t.prefill_tokens_per_second
        seconds = t.queue_seconds + (tokens / rate if rate > 0 else 0.0)
        return PrefixCopy(target.id, depth, tokens, seconds)

    def _hot_bounds(self, least: int) -> tuple[int, float]:
        """(sharers, load): a holder with at least that many requests in flight carrying the
        prefix and a load above that is hot, next to a least-loaded candidate at `least`."""
        p = self.params
        if least == 0 and p.idle_copy_sharers <= p.hot_gap_requests:
            # an idle pod: a burst on the prefix is copied there at once
            return p.idle_copy_sharers, p.idle_copy_sharers - 1
        return p.hot_gap_requests, max(least + p.hot_gap_requests, p.hot_ratio * least)


def _targets(
    state: CycleState, candidates: Sequence[EndpointSnapshot]
) -> Sequence[EndpointSnapshot]:
    """The pods whose load is the bounds' base (see the module docstring): for an online
    request those hosting no batch request (none: the guard is off)."""
    if state.request.request_class == "online":
        return [e for e in candidates if e.batch_in_flight == 0]
    return candidates
