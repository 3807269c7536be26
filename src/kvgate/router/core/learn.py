"""After a request: record what happened, so the next decision is better informed.

- Routing history: for pods without KV events, the request's block keys are added to the pod's
  directory entries as approximate entries (TTL), right after the decision and before the request
  is sent (so that a burst of requests with one prefix already sees where the first went).
  Pods with KV events get the same entries while other router replicas share the directory and
  the policy counts blocks in flight: each replica counts only its own requests' blocks in
  flight (`accounting.py`), and the others would otherwise see a new prefix only once the pod
  has computed it. The pod's `BlockStored` turns each entry into an exact one and its
  `BlockRemoved` drops it, so only the blocks of a request that never reached its prefill stay
  claimed until the TTL.
- Prefill rate: a streaming request's TTFT on a pod that had nothing queued ahead of it from
  this router is an observation of (uncached tokens → seconds) for the estimator; uncached
  tokens come from the engine's `cached_tokens` when it reported them. (The engine's counters,
  Δprompt tokens over Δ`vllm:request_prefill_time_seconds_sum`, are not used: that sum adds up
  every request's prefill span, and under load the spans of the requests sharing each step
  overlap, so it read several times too slow, and differently on every pod.)
- Metrics: requests by pool/endpoint/class/decision/status, predicted and engine-reported cached
  tokens, prompt tokens, estimated saved prefill seconds, TTFT and duration.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import Counter

from kvgate.directory.base import BlockIndex
from kvgate.discovery.endpoints import Endpoint
from kvgate.prefix import BlockKey
from kvgate.router.core.routing import RoutePlan
from kvgate.router.metrics import RouterMetrics
from kvgate.scoring.cost_model import CostModelParams
from kvgate.scoring.output_length import OutputLengthEstimator
from kvgate.scoring.prefill_rate import PrefillRateEstimator

log = logging.getLogger(__name__)
request_log = logging.getLogger("kvgate.router.requests")

_REGISTERED_STATUSES = frozenset(status.value for status in HTTPStatus)


def status_label(status: int) -> str:
    """The `code` label of a pod's answer: a registered HTTP status as itself ("200", "429"),
    any other as its class ("2xx" ... "5xx"; "other" outside 100-599). The pod chooses the
    status: every three-digit number as a label would be ~900 series per pod and decision."""
    if status in _REGISTERED_STATUSES:
        return str(status)
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


@dataclass(frozen=True)
class Usage:
    """What the engine reported of a request (`usage` in its answer)."""

    prompt_tokens: int
    cached_tokens: int | None  # None: the engine did not report prompt_tokens_details
    completion_tokens: int


@dataclass(slots=True)
class Outcome:
    """What is learned from one finished attempt."""

    plan: RoutePlan
    status: int
    ttft_seconds: float | None  # streamed answers only: first byte of the stream
    duration_seconds: float
    usage: Usage | None
    retries: int
    queued_ahead: int  # this router's requests pending prefill on the pod when sent
    completed: bool  # the whole answer reached the client


class Learner:
    def __init__(
        self,
        metrics: RouterMetrics,
        estimator: PrefillRateEstimator,
        output_lengths: OutputLengthEstimator,
        indexes: Mapping[str, BlockIndex],
        directory_errors: Counter,
        *,
        approximate_ttl_seconds: float,
        access_log: bool = False,
        prior_tokens_per_second: float = CostModelParams().prior_prefill_tokens_per_second,
    ) -> None:
        self.metrics = metrics
        self.estimator = estimator
        self.output_lengths = output_lengths
        self.indexes = indexes
        self.directory_errors = directory_errors
        self.ttl = approximate_ttl_seconds
        self.access_log = access_log
        self.prior = prior_tokens_per_second

    async def routed(self, plan: RoutePlan, *, share_in_flight: bool = False) -> None:
        """Right after the decision: routing history for pods without KV events, and for pods
        with them when `share_in_flight` (other replicas share the directory). Awaited on the
        request path (memory: microseconds; Redis: one round trip) so that the next request of
        a burst already sees it; a failing directory is counted, never fails the request."""
        await self._history(plan, plan.endpoint, plan.keys.lookup_keys, share_in_flight)

    async def copied(
        self, plan: RoutePlan, target: Endpoint, blocks: int, *, share_in_flight: bool = False
    ) -> None:
        """A copy of the plan's first `blocks` blocks was sent to `target` (`prefix_copies.py`):
        its routing history, as `routed` records a request's."""
        await self._history(plan, target, plan.keys.lookup_keys[:blocks], share_in_flight)

    async def _history(
        self, plan: RoutePlan, ep: Endpoint, keys: Sequence[BlockKey], share_in_flight: bool
    ) -> None:
        exact_events = plan.pool.engine.kv_events and ep.spec.kv_events is not None
        if exact_events and plan.keys.exact and not share_in_flight:
            return
        index = self.indexes.get(plan.pool.key)
        if index is None or not keys:
            return
        try:
            await index.add_approximate(ep.id, keys, self.ttl)
        except Exception as exc:
            self.directory_errors.labels("add_approximate").inc()
            log.warning("routing history for %s not recorded: %r", ep.id, exc)

    def finished(self, outcome: Outcome, request_id: str = "") -> None:
        plan = outcome.plan
        if self.access_log:
            usage = outcome.usage
            request_log.info(
                "request_id=%s pool=%s endpoint=%s class=%s tenant=%s session=%s decision=%s "
                "status=%d prompt_tokens=%s predicted_hit_tokens=%d cached_tokens=%s "
                "ttft_ms=%s duration_ms=%.1f retries=%d",
                request_id,
                plan.pool.key,
                plan.endpoint.id,
                plan.classification.request_class,
                plan.classification.tenant,
                plan.classification.session_id,
                plan.decision.reason,
                outcome.status,
                usage.prompt_tokens if usage else None,
                plan.decision.predicted_hit_tokens,
                usage.cached_tokens if usage else None,
                None if outcome.ttft_seconds is None else round(outcome.ttft_seconds * 1000, 1),
                outcome.duration_seconds * 1000,
                outcome.retries,
            )
        pool, ep = plan.pool.key, plan.endpoint.id
        cls = plan.classification.request_class
        m = self.metrics
        code = status_label(outcome.status)
        m.child(m.requests, pool, ep, cls, plan.decision.reason, code).inc()
        m.child(m.decision_latency, pool).observe(plan.decision_seconds)
        m.child(m.duration, pool, cls).observe(outcome.duration_seconds)
        if outcome.ttft_seconds is not None:
            m.child(m.ttft, pool, cls).observe(outcome.ttft_seconds)
        usage = outcome.usage
        if usage is None:
            return
        cached = usage.cached_tokens or 0
        if usage.cached_tokens is not None:
            # The hit-rate series all count the answers that report their cached tokens, and
            # only those: an embedding's usage has none, an error or a broken stream (a
            # continuous-usage chunk) none or no usage at all, and none of them is a miss.
            m.child(m.predicted_hit_tokens, pool, ep).inc(plan.decision.predicted_hit_tokens)
            m.child(m.prompt_tokens, pool, ep).inc(usage.prompt_tokens)
            if plan.classification.session_id is not None:
                m.child(m.session_prompt_tokens, pool).inc(usage.prompt_tokens)
                m.child(m.session_cached_tokens, pool).observe(cached)
        if cached:
            m.child(m.cached_tokens, pool, ep).inc(cached)
            rate = self.estimator.rate(ep) or self.prior
            m.child(m.saved_prefill_seconds, pool).inc(cached / rate)
        if outcome.completed and outcome.status == 200:
            self.output_lengths.observe(pool, usage.completion_tokens, usage.prompt_tokens)
        if outcome.ttft_seconds is not None and outcome.status == 200:
            uncached = usage.prompt_tokens - cached if usage.cached_tokens is not None else None
            self.estimator.observe_ttft(
                ep,
                uncached if uncached is not None else plan.uncached_tokens,
                outcome.ttft_seconds,
                outcome.queued_ahead,
            )
