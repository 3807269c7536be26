"""The scoring contract: what a routing decision reads and what it returns.

A **policy** turns one request into one decision:

    decide(request, endpoints, matched_blocks, now=..., rng=..., history=...) -> Decision

- ``request`` (:class:`RoutingRequest`): the request's features, computed by the router
  (prompt token count, block keys, class, tenant, session).
- ``endpoints`` (:class:`EndpointSnapshot`): one immutable snapshot per candidate pod (already
  restricted to pools serving the request's model): health, the router's own in-flight and
  pending-prefill counts, engine-reported load from ``/metrics`` (only when fresh), the pod's
  learned prefill rate.
- ``matched_blocks`` (:data:`MatchedBlocks`): the directory's answer, pod id -> number of leading
  blocks of ``request.block_keys`` that pod holds (absent = 0).
- ``now``: the router core's clock (seconds); ``rng``: the only source of randomness;
  ``history``: which pods earlier decisions chose (read only here).

The pipeline is **pure**: no I/O, no clock reads, no mutation of its inputs (the ``rng`` advances,
nothing else changes). The caller records the outcome: ``history.record(decision.endpoint_id, ...)``
after each decision it acts on. The same code therefore runs in the live router and in the
simulator's discrete-event mode.

Inside a policy, a decision runs **filters -> scorers -> picker** over a per-request
:class:`CycleState` that holds the cost model's per-endpoint :class:`CostEstimate` (computed once,
shared by every plugin):

- a :class:`Filter` drops candidates. A *hard* filter (``reason`` None, e.g. health) may drop
  all of them (the policy then raises :class:`NoEligibleEndpointError`); a *guard* (``reason``
  set, e.g. ``affinity-cap``) never does: if it would leave none it returns its input unchanged,
  and when it moves the request off the pod holding the longest prefix, the decision's reason is
  the guard's ``reason``;
- a :class:`Scorer` gives every candidate a score in [0, 1], 1 is best;
- a :class:`Picker` chooses one candidate from the weighted sum of the scores.

Scorers and filters never mutate their inputs. Plugins are built by name (kebab-case) with typed
parameters through :class:`kvgate.scoring.registry.PluginRegistry`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

PoolClass = Literal["online", "batch"]
RequestClass = Literal["online", "batch"]

#: The directory's answer: pod id -> number of leading request blocks the pod holds.
MatchedBlocks = Mapping[str, int]

#: Decision reasons (the ``x-kvgate-decision`` header). Short, stable, machine-readable.
REASON_PREFIX_HIT = "prefix-hit"  # chose a pod holding the longest useful prefix
REASON_LOAD_SPILL = "load-spill"  # a pod held more of the prefix, but another was predicted faster
REASON_AFFINITY_CAP = "affinity-cap"  # the faster-by-cost holder exceeded maxAffinityWait
REASON_LOAD_BOUND = "load-bound"  # the best pod was above the load bound (c x mean in-flight)
REASON_CLASS_ISOLATION = "class-isolation"  # an online request left pods batch work borrowed
REASON_NO_HIT_SPREAD = "no-hit-spread"  # no pod held any of the prefix: spread by load/recency
REASON_LEAST_LOAD = "least-load"
REASON_ROUND_ROBIN = "round-robin"


class NoEligibleEndpointError(LookupError):
    """No endpoint can take the request (none given, or all unhealthy/draining/ineligible)."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Load reported by the engine's ``/metrics`` (vllm:num_requests_*, vllm:kv_cache_usage_perc)."""

    waiting: int
    running: int
    kv_cache_usage: float  # 0..1
    running_lora_adapters: frozenset[str] = frozenset()  # vllm:lora_requests_info
    waiting_lora_adapters: frozenset[str] = frozenset()
    max_lora: int = 0  # adapters a batch may use (--max-loras); 0 = no LoRA serving reported
    recent_lora_adapters: frozenset[str] = frozenset()  # likely still in a GPU slot
    # The router's requests there with no first token yet when this was scraped (the waiting
    # count includes them); None = unknown: the snapshot's current count stands in.
    pending_at_scrape: int | None = None
    # The KV cache's size in tokens (0 = not reported), and whether the engine has written at
    # least that many tokens into it since it started (from then on, each one it writes evicts
    # a block used earlier): kvgate.discovery.endpoints.LoadSample.
    kv_capacity_tokens: int = 0
    kv_filled: bool = False

    def foreign_waiting(self, pending_now: int) -> int:
        """Waiting requests that are not this router's (other replicas', direct clients'), as
        of the scrape; ``pending_now`` stands in for an unknown ``pending_at_scrape``."""
        mine = pending_now if self.pending_at_scrape is None else self.pending_at_scrape
        return self.waiting - mine if self.waiting > mine else 0


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One pod as the router sees it at decision time. Immutable; built by the router."""

    id: str  # pod identity, same string the directory uses
    pool: str
    pool_class: PoolClass = "online"
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0  # requests this router sent and that have not completed
    batch_in_flight: int = 0  # of those, batch-class requests
    pending_prefill_requests: int = 0  # sent, no first byte yet
    pending_prefill_tokens: int = 0  # uncached prompt tokens of those (predicted at routing time)
    # None = never scraped, or last scraped longer ago than the router's
    # load_metrics.stale_after_seconds: a policy never sees stale engine numbers
    engine: EngineLoad | None = None
    prefill_tokens_per_second: float | None = None  # learned estimate; None = the cost model prior
    max_num_seqs: int | None = None  # engine batch limit, when known


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """The features of one request that routing needs."""

    model: str
    prompt_tokens: int
    block_tokens: int = 16  # tokens per block (vLLM --block-size; an estimate for char blocks)
    block_keys: Sequence[bytes] = ()
    keys_exact: bool = True  # False: approximate keys (char blocks / routing history)
    # A prefix of the prompt can be sent alone (its token ids, or a completion's text with
    # approximate keys): what a background copy needs (`Copier`).
    copyable: bool = True
    request_class: RequestClass = "online"
    tenant: str | None = None
    session_id: str | None = None
    # For pools whose engines offload KV blocks to CPU memory: each pod's leading blocks held
    # on the GPU; the rest of its `matched_blocks` is in the CPU tier and must be loaded back
    # (priced by the cost model's `cpu_load_tokens_per_second`). None: every match is on the GPU.
    gpu_matched_blocks: Mapping[str, int] | None = None
    lora_adapter: str | None = None  # the LoRA adapter the request names, if any
    # Per pod with a match: the requests in flight there that carry the whole matched prefix
    # (None: the router does not count blocks in flight).
    prefix_sharers: Mapping[str, int] | None = None
    # For an online request: the batch requests queued in this router with no batch pool of
    # their own, to run on a pod of its pool once one has room under the borrowing limits
    # (`class-isolation` then hands them the lightest online pod).
    batch_waiting: int = 0
    # Tokens the answer is expected to run to (0: unknown), learned from the pool's answers
    # (kvgate.scoring.output_length); prices the decode on each pod (``decode_seconds``).
    expected_output_tokens: float = 0.0


class CostEstimate(NamedTuple):
    """The cost model's prediction for sending the request to one endpoint.

    (A NamedTuple rather than a frozen dataclass: one is built per endpoint per decision, and
    tuples are several times cheaper to construct.)
    """

    endpoint_id: str
    hit_tokens: int  # prompt tokens predicted to be served from the pod's prefix cache
    uncached_tokens: int
    load: int  # effective requests on the pod (max of router in-flight and engine-reported)
    prefill_tokens_per_second: float  # effective rate used (learned or prior, decode-adjusted)
    queue_seconds: float  # predicted wait before this request's prefill starts
    prefill_seconds: float  # predicted prefill time of the uncached tokens (+ CPU-tier loads)
    cpu_hit_tokens: int = 0  # of hit_tokens, those in the CPU tier (loaded back, not recomputed)
    # predicted time the answer's decode steps spend reading the KV cache of the pod's other
    # requests (expected output tokens x their active KV tokens x seconds per KV token read)
    decode_seconds: float = 0.0

    @property
    def ttft_seconds(self) -> float:
        """Predicted time to first token (queue + prefill), the quantity `kvgate` minimises."""
        return self.queue_seconds + self.prefill_seconds


UNCACHED_HALF_LIFE_SECONDS = 120.0
"""Long enough to span many requests on a pod, short enough to follow a change of traffic."""


class ChoiceHistory:
    """Which endpoint each decision chose, in order, and how much prompt it sent each one to
    compute lately. Owned (and updated) by the caller.

    Policies only read it: ``last_chosen(id)`` is the sequence number of the most recent decision
    that chose ``id`` (-1 = never), so "least recently chosen" is the smallest value. Round robin
    and no-hit spreading use it; it survives endpoints joining and leaving.
    ``recent_uncached_tokens(id, now)``: the uncached prompt tokens of the decisions that chose
    ``id``, each decayed with a half-life of ``UNCACHED_HALF_LIFE_SECONDS``: how fast this router
    writes into that pod's KV cache (``least-turnover`` ties).
    """

    __slots__ = ("_last", "_seq", "_uncached")

    def __init__(self) -> None:
        self._seq = 0
        self._last: dict[str, int] = {}
        self._uncached: dict[str, tuple[float, float]] = {}  # id -> (decayed tokens, as of)

    def record(self, endpoint_id: str, uncached_tokens: int = 0, now: float = 0.0) -> None:
        """Note that the latest decision chose ``endpoint_id``, to compute ``uncached_tokens``
        of its prompt there (``now``: the decision's clock value)."""
        self._last[endpoint_id] = self._seq
        self._seq += 1
        if uncached_tokens > 0:
            recent = self.recent_uncached_tokens(endpoint_id, now)
            self._uncached[endpoint_id] = (recent + uncached_tokens, now)

    def last_chosen(self, endpoint_id: str) -> int:
        return self._last.get(endpoint_id, -1)

    def recent_uncached_tokens(self, endpoint_id: str, now: float) -> float:
        tokens, at = self._uncached.get(endpoint_id, (0.0, now))
        return tokens * math.pow(0.5, max(0.0, now - at) / UNCACHED_HALF_LIFE_SECONDS)

    def forget(self, endpoint_id: str) -> None:
        """Drop a departed endpoint (keeps the history bounded by the fleet size)."""
        self._last.pop(endpoint_id, None)
        self._uncached.pop(endpoint_id, None)

    def __len__(self) -> int:
        return len(self._last)


@dataclass(slots=True)
class CycleState:
    """Per-decision state shared by the plugins of one policy. Built by the policy, then read only.

    ``estimates`` covers every endpoint passed to the policy (not only the survivors of the
    filters), so explanations can show what a filter dropped.
    """

    request: RoutingRequest
    matched_blocks: MatchedBlocks
    now: float
    rng: random.Random
    history: ChoiceHistory
    estimates: Mapping[str, CostEstimate]
    max_hit_tokens: int  # the largest hit_tokens over all endpoints (0 = no pod holds any prefix)


class Filter(Protocol):
    """Drops candidates: returns a subsequence of ``candidates``. A guard (``reason`` not None)
    never returns an empty one for a non-empty input; a hard filter (``reason`` None) may."""

    @property
    def name(self) -> str: ...

    @property
    def reason(self) -> str | None:
        """The decision reason when this guard moved the request off its holder; None = hard."""
        ...

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]: ...


class Scorer(Protocol):
    """Scores every candidate in [0, 1], 1 is best. Returns one value per candidate, same order.
    One that reads ``CostEstimate.decode_seconds`` also sets ``decode_min_output_ratio`` (the
    router learns and passes the expected output only for such policies, and only in pools whose
    answers average at least that many output tokens per prompt token)."""

    @property
    def name(self) -> str: ...

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]: ...


class Picker(Protocol):
    """Chooses one candidate given the weighted total score of each (same order, higher is better).
    ``candidates`` is non-empty."""

    @property
    def name(self) -> str: ...

    def pick(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot], totals: Sequence[float]
    ) -> EndpointSnapshot: ...


class PrefixCopy(NamedTuple):
    """A prefix the router should copy onto another pod by itself, no client request waiting
    for it: the first ``blocks`` blocks of the request's prompt, to ``endpoint_id``."""

    endpoint_id: str
    blocks: int
    tokens: int  # prompt tokens the copy computes there (what the pod lacks of the prefix)
    seconds: float  # predicted time until the copy is computed there (queue + prefill)


class Copier(Protocol):
    """Proposes, after the pick, a copy of the request's prefix onto another pod (or None)."""

    def copy(
        self,
        state: CycleState,
        candidates: Sequence[EndpointSnapshot],
        chosen: EndpointSnapshot,
    ) -> PrefixCopy | None: ...


@runtime_checkable
class ExplainsTies(Protocol):
    """A picker that can say, after the fact, which rule chose among near-equal candidates."""

    def tie_break(self, estimates: Sequence[CostEstimate], totals: Sequence[float]) -> str | None:
        """The rule for candidates with these estimates and totals (same order), or None when
        one candidate led alone."""
        ...


class CandidateExplanation(NamedTuple):
    """One endpoint's line in a decision explanation (``/debug/route``)."""

    estimate: CostEstimate
    scores: Mapping[str, float]  # scorer name -> score in [0, 1]; empty if filtered out
    total_score: float | None  # None if filtered out
    dropped_by: str | None  # filter name, or None if it reached the picker
    prefix_sharers: int = 0  # the router's requests in flight there carrying the matched prefix
    first_tokens_due: int = 0  # the router's requests there with no first token yet
    foreign_waiting: int = 0  # requests the engine last reported waiting beyond the router's

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "endpoint": e.endpoint_id,
            "hit_tokens": e.hit_tokens,
            "cpu_hit_tokens": e.cpu_hit_tokens,
            "uncached_tokens": e.uncached_tokens,
            "load": e.load,
            "prefill_tokens_per_second": round(e.prefill_tokens_per_second, 1),
            "queue_seconds": round(e.queue_seconds, 6),
            "prefill_seconds": round(e.prefill_seconds, 6),
            "predicted_ttft_seconds": round(e.ttft_seconds, 6),
            "decode_seconds": round(e.decode_seconds, 6),
            "scores": {k: round(v, 6) for k, v in self.scores.items()},
            "total_score": None if self.total_score is None else round(self.total_score, 6),
            "dropped_by": self.dropped_by,
            "prefix_sharers": self.prefix_sharers,
            "first_tokens_due": self.first_tokens_due,
            "foreign_waiting": self.foreign_waiting,
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """What a decision saw, kept raw; :meth:`candidates` builds the per-endpoint lines on demand
    (only ``/debug/route`` and logs need them, so the hot path does not pay for them)."""

    estimates: Mapping[str, CostEstimate]  # every endpoint given to the policy, in input order
    dropped: Mapping[str, str]  # endpoint id -> the filter that dropped it
    survivors: Sequence[str]  # ids of the filters' survivors; the lists below follow this order
    scores: Mapping[str, Sequence[float]]  # scorer name -> score of each survivor
    totals: Sequence[float]  # weighted total of each survivor
    prefix_sharers: Mapping[str, int] | None = None  # RoutingRequest.prefix_sharers
    batch_waiting: int = 0  # RoutingRequest.batch_waiting
    picker: Picker | None = None  # asked for the tie-break only when the explanation is read
    endpoints: Sequence[EndpointSnapshot] = ()  # the snapshots decided on, read on demand

    def tie_break(self) -> str | None:
        """Which rule chose among near-equal survivors (None: one led alone, or the picker does
        not say)."""
        if not isinstance(self.picker, ExplainsTies):
            return None
        return self.picker.tie_break([self.estimates[i] for i in self.survivors], self.totals)

    def candidates(self) -> tuple[CandidateExplanation, ...]:
        out: list[CandidateExplanation] = []
        index = {eid: i for i, eid in enumerate(self.survivors)}
        sharers = self.prefix_sharers or {}
        due = {e.id: e.pending_prefill_requests for e in self.endpoints}
        foreign = {
            e.id: e.engine.foreign_waiting(e.pending_prefill_requests)
            for e in self.endpoints
            if e.engine is not None
        }
        for eid, est in self.estimates.items():
            i = index.get(eid)
            n, d, f = sharers.get(eid, 0), due.get(eid, 0), foreign.get(eid, 0)
            if i is None:
                out.append(CandidateExplanation(est, {}, None, self.dropped.get(eid), n, d, f))
            else:
                scores = {name: values[i] for name, values in self.scores.items()}
                out.append(CandidateExplanation(est, scores, self.totals[i], None, n, d, f))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one routing decision, with its explanation."""

    endpoint_id: str
    pool: str
    reason: str  # one of the REASON_* values
    policy: str
    predicted_hit_tokens: int
    predicted_ttft_seconds: float
    explanation: Explanation | None = None
    copy: PrefixCopy | None = None  # a copy of the prefix the router should start (`Copier`)

    @property
    def candidates(self) -> tuple[CandidateExplanation, ...]:
        """One line per endpoint given to the policy (empty without an explanation)."""
        return () if self.explanation is None else self.explanation.candidates()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready explanation (the body of ``/debug/route``)."""
        return {
            "endpoint": self.endpoint_id,
            "pool": self.pool,
            "reason": self.reason,
            "policy": self.policy,
            "predicted_hit_tokens": self.predicted_hit_tokens,
            "predicted_ttft_seconds": round(self.predicted_ttft_seconds, 6),
            "tie_break": None if self.explanation is None else self.explanation.tie_break(),
            "batch_waiting": 0 if self.explanation is None else self.explanation.batch_waiting,
            "candidates": [c.to_dict() for c in self.candidates],
            "copy": None
            if self.copy is None
            else {
                "endpoint": self.copy.endpoint_id,
                "tokens": self.copy.tokens,
                "predicted_seconds": round(self.copy.seconds, 6),
            },
        }


class Policy(Protocol):
    """A routing policy. Pure: see the module docstring."""

    @property
    def name(self) -> str: ...

    @property
    def counts_inflight_blocks(self) -> bool:
        """Whether the router adds the blocks of its requests in flight on each pod to the
        directory's matches before deciding (kvgate's policies; the peers' re-implementations
        and the plain baselines see the directory only, as published)."""
        ...

    @property
    def decode_min_output_ratio(self) -> float | None:
        """Where a scorer prices the answer's decode (``CostEstimate.decode_seconds``): in pools
        whose answers average at least this many output tokens per prompt token (None: nowhere).
        Only there does the router fill ``RoutingRequest.expected_output_tokens`` (else it stays
        0 and no estimate carries a decode price)."""
        ...

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
        """Choose an endpoint. Raises :class:`NoEligibleEndpointError` if none can take it."""
        ...
