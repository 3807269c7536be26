"""The router's Prometheus metrics, registered into one registry that the app owns.

Names follow `kvgate_router_<what>_<unit>`; counters end in `_total`. Label values are bounded:
pools and endpoints come from configuration/discovery, `decision` is the policy's short reason
kind, never free text. The directory and its KV-event indexer export `kvgate_directory_*`
(events by type, seq gaps, replays, pod clears, entries) into the same registry.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvgate.directory.metrics import remove_series

MAX_LEFT_ENDPOINTS = 4096
"""Pods whose series were removed and whose new ones are refused (answers that outlived the
grace below)."""
SERIES_GRACE_SECONDS = 600.0
"""How long a pod's series outlive it: its answers in flight when it left are still counted,
and a pod that comes back meanwhile keeps its series (an in-flight gauge stays right)."""

#: The label naming the pod a series is about. Not "endpoint": the Prometheus Operator sets a
#: target label of that name (the scrape port's), which renamed the router's to
#: `exported_endpoint` and folded every pod's series into one.
POD_LABEL = "upstream"

_LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)  # a large prompt keyed in a worker decides in seconds: past the last bucket, a p99 reads it
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_QUEUE_BUCKETS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
_TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class RouterMetrics:
    """Every metric the router exports. One instance per app, with its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._leaving: OrderedDict[str, float] = OrderedDict()  # endpoint -> when it left
        self._leaving_pools: dict[str, float] = {}  # pool -> when it left the configuration
        self._left: OrderedDict[str, None] = OrderedDict()  # endpoints gone, oldest first
        # endpoint -> its series, as `child` made them (what `_forget_endpoint` removes)
        self._series: dict[str, list[tuple[Any, tuple[str, ...]]]] = {}
        r = self.registry
        self.requests = Counter(
            "kvgate_router_requests_total",
            "Requests answered, by pool, endpoint, class, decision and HTTP status",
            ["pool", POD_LABEL, "request_class", "decision", "code"],
            registry=r,
        )
        self.decision_latency = Histogram(
            "kvgate_router_decision_latency_seconds",
            "Time to classify, tokenize, hash, look up and score one request",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.predicted_hit_tokens = Counter(
            "kvgate_router_predicted_prefix_hit_tokens_total",
            "Prompt tokens the router predicted the chosen pod holds, of the answers that report "
            "their cached tokens (usage.prompt_tokens_details)",
            ["pool", POD_LABEL],
            registry=r,
        )
        self.cached_tokens = Counter(
            "kvgate_router_cached_tokens_total",
            "Prompt tokens served from the prefix cache, as the engine reported in usage",
            ["pool", POD_LABEL],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "kvgate_router_prompt_tokens_total",
            "Prompt tokens, as the engine reported in usage, of the answers that report their "
            "cached tokens (the hit rate's denominator)",
            ["pool", POD_LABEL],
            registry=r,
        )
        self.saved_prefill_seconds = Counter(
            "kvgate_router_saved_prefill_seconds_total",
            "Estimated GPU prefill seconds saved by cache hits (cached tokens / prefill rate)",
            ["pool"],
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_router_ttft_seconds",
            "Router-measured time to the first response byte",
            ["pool", "request_class"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "kvgate_router_request_duration_seconds",
            "Router-measured time to the last response byte",
            ["pool", "request_class"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "kvgate_router_retries_total",
            "Requests re-sent to another pod after a failure before the first byte",
            ["pool"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "kvgate_router_upstream_errors_total",
            "Failures talking to a pod, by kind (connect, timeout, status, stream)",
            ["pool", POD_LABEL, "kind"],
            registry=r,
        )
        self.inflight = Gauge(
            "kvgate_router_inflight_requests",
            "Requests this router has in flight to each pod",
            ["pool", POD_LABEL],
            registry=r,
        )
        self.endpoints = Gauge(
            "kvgate_router_endpoints",
            "Endpoints known to the router, by state (ready, ejected)",
            ["pool", "state"],
            registry=r,
        )
        self.prefix_breaks = Counter(
            "kvgate_router_prefix_breaks_total",
            "Session turns whose prompt diverged from the previous turn's prompt",
            ["pool", "field"],
            registry=r,
        )
        # Per session turn, not per session: a session id label would be unbounded.
        self.session_cached_tokens = Histogram(
            "kvgate_router_session_cached_tokens",
            "Cached prompt tokens (engine-reported) of each request that carries a session id",
            ["pool"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.session_prompt_tokens = Counter(
            "kvgate_router_session_prompt_tokens_total",
            "Prompt tokens (engine-reported) of requests that carry a session id",
            ["pool"],
            registry=r,
        )
        self.prefix_break_lost_tokens = Histogram(
            "kvgate_router_prefix_break_lost_tokens",
            "Tokens of the previous turn's prompt after a session's prefix break (cache lost)",
            ["pool"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.scrape_errors = Counter(
            "kvgate_router_scrape_errors_total",
            "Failed scrapes of a pod's /metrics",
            ["pool", POD_LABEL],
            registry=r,
        )
        self.config_reloads = Counter(
            "kvgate_router_config_reloads_total",
            "Configuration reloads, by result (ok, error)",
            ["result"],
            registry=r,
        )
        # The HTTP edge (docs/security.md): clients that leave, connections refused or closed
        # by a limit, requests cut at the end of the shutdown grace.
        self.client_disconnects = Counter(
            "kvgate_router_client_disconnects_total",
            "Clients that closed the connection before their request was answered, by stage",
            ["stage"],
            registry=r,
        )
        self.connections_closed = Counter(
            "kvgate_router_connections_closed_total",
            "Client connections refused or closed by a limit (header_too_large, header_timeout, "
            "body_timeout, over_capacity, evicted_idle, write_stall)",
            ["reason"],
            registry=r,
        )
        self.open_connections = Gauge(
            "kvgate_router_open_connections",
            "Client connections open now",
            registry=r,
        )
        self.responses = Counter(
            "kvgate_router_responses_total",
            "Every response the router sent its clients, by status code (a pod's answer, or the "
            "router's own: 400, 404, 429, 502, 503, 504, ...): when every pod fails, "
            "requests_total (answers from pods) stops while this goes on",
            ["code"],
            registry=r,
        )
        self.shutdown_cut_requests = Counter(
            "kvgate_router_shutdown_cut_requests_total",
            "Requests still running when the shutdown grace ran out, by how they were ended "
            "(stream: error event, unavailable: 503, closed)",
            ["response"],
            registry=r,
        )

        # Flow control (`core/admission.py`): requests waiting for a pod with room.
        self.queue_wait = Histogram(
            "kvgate_router_queue_wait_seconds",
            "Time requests waited in the router's queue (0 for those sent at once), by how the "
            "wait ended (dispatched, deadline, cancelled, pushed_out)",
            ["pool", "request_class", "outcome"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.queued = Gauge(
            "kvgate_router_queued_requests",
            "Requests waiting in the router's queue now",
            ["pool", "request_class"],
            registry=r,
        )
        self.queued_bytes = Gauge(
            "kvgate_router_queued_bytes",
            "Request body bytes held by the router's queues now",
            registry=r,
        )
        self.queue_refusals = Counter(
            "kvgate_router_queue_refusals_total",
            "Requests answered 429 by flow control, by reason (queue_full, deadline_exceeded)",
            ["pool", "request_class", "reason"],
            registry=r,
        )

        # Warm-up of pods that join a pool (core/warmup.py).
        self.warmups = Counter(
            "kvgate_router_warmups_total",
            "Warm-ups of pods that joined a pool, by result (warmed, timed_out, nothing_hot; "
            "followed: another router replica warmed it)",
            ["pool", "result"],
            registry=r,
        )
        self.warm_requests = Counter(
            "kvgate_router_warm_requests_total",
            "Warm requests (a hot prefix, max_tokens 1) sent to pods, by result (ok, error)",
            ["pool", "result"],
            registry=r,
        )
        self.prefix_copies = Counter(
            "kvgate_router_prefix_copies_total",
            "Copies of a prefix hot on its holder that the router computed on another pod by "
            "itself, by result (ok, error; skipped: one of that prefix or too many in flight)",
            ["pool", "result"],
            registry=r,
        )
        self.warm_prefill_tokens = Counter(
            "kvgate_router_warm_prefill_tokens_total",
            "Prompt tokens of the warm requests pods answered",
            ["pool"],
            registry=r,
        )
        self.endpoint_warm_phase = Gauge(
            "kvgate_router_endpoint_warm_phase",
            "1 while a pod that joined is in this warm-up phase (warming: no client requests; "
            "ramping: a growing share of them)",
            ["pool", POD_LABEL, "phase"],
            registry=r,
        )

        self.warm_sharing_errors = Counter(
            "kvgate_router_warm_sharing_errors_total",
            "Warm-up claims, follows and hot-prefix exchanges with the other router replicas "
            "that failed or timed out (a failed claim or follow warms the pod on its own), by "
            "pool and operation (claim, follow, done, publish)",
            ["pool", "operation"],
            registry=r,
        )

        # Load shared between router replicas (http/load_sharing.py).
        self.load_sharing_errors = Counter(
            "kvgate_router_load_sharing_errors_total",
            "Load exchanges with the other router replicas that failed or timed out, by pool",
            ["pool"],
            registry=r,
        )
        self.load_sharing_peers = Gauge(
            "kvgate_router_load_sharing_peers",
            "Other router replicas whose load this replica adds to its own",
            registry=r,
        )
        self.load_sharing_degraded = Gauge(
            "kvgate_router_load_sharing_degraded",
            "1 while load sharing is on but the other replicas' load is too old to use",
            registry=r,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: `labels()` costs more than the update on the hot path.
        Every per-endpoint series is made here; a pod that left gets none (`_forget_endpoint`)."""
        key = (metric._name, labels)
        found = self._children.get(key)
        if found is None:
            names = metric._labelnames
            if POD_LABEL in names:
                endpoint = labels[names.index(POD_LABEL)]
                if endpoint in self._left:
                    return _DISCARDED
                self._series.setdefault(endpoint, []).append((metric, labels))
            found = self._children[key] = metric.labels(*labels)
        return found

    def init_endpoint(self, pool: str, endpoint: str) -> None:
        """Create an endpoint's counters at 0 when it joins: Prometheus' rate() cannot see the
        first increment of a series that appears with a value already above 0."""
        self._leaving.pop(endpoint, None)
        self._left.pop(endpoint, None)
        for metric in (self.cached_tokens, self.prompt_tokens, self.predicted_hit_tokens):
            self.child(metric, pool, endpoint)
        self.child(self.inflight, pool, endpoint)

    def endpoint_left(self, endpoint: str, now: float) -> None:
        """`endpoint` left the pools: its series go `SERIES_GRACE_SECONDS` later (`sweep`)."""
        self._leaving[endpoint] = now
        self._leaving.move_to_end(endpoint)

    def sweep(self, now: float) -> None:
        """Remove the series of the pods that left `SERIES_GRACE_SECONDS` ago or more: a
        rollout of two pods left ~16 series behind for good, 3,184 after 200 rollouts."""
        for pool, left_at in list(self._leaving_pools.items()):
            if now - left_at >= SERIES_GRACE_SECONDS:
                del self._leaving_pools[pool]
                self._forget_pool(pool)
        while self._leaving:
            endpoint, left_at = next(iter(self._leaving.items()))
            if now - left_at < SERIES_GRACE_SECONDS:
                return
            del self._leaving[endpoint]
            self._forget_endpoint(endpoint)

    def _forget_endpoint(self, endpoint: str) -> None:
        """Remove every series of `endpoint`, and make none for it until it joins again."""
        self._left[endpoint] = None
        while len(self._left) > MAX_LEFT_ENDPOINTS:
            self._left.popitem(last=False)
        # Its own series only (every per-endpoint series is made by `child`): reading every
        # metric's samples for each pod that left held the loop 2.6 s for 100 pods at once.
        for metric, labels in self._series.pop(endpoint, ()):
            with contextlib.suppress(KeyError):  # gone with its pool (`_forget_pool`)
                metric.remove(*labels)
            self._children.pop((metric._name, labels), None)

    def pool_left(self, pool: str, now: float) -> None:
        """`pool` left the configuration: its series go `SERIES_GRACE_SECONDS` later (`sweep`),
        once the answers in flight from its pods are counted (~265 series a pool, before)."""
        self._leaving_pools[pool] = now

    def _forget_pool(self, pool: str) -> None:
        for key in remove_series(vars(self).values(), "pool", pool):
            self._children.pop(key, None)

    def init_pool(self, pool: str) -> None:
        self._leaving_pools.pop(pool, None)
        for metric in (self.saved_prefill_seconds, self.session_prompt_tokens, self.retries):
            self.child(metric, pool)
        for request_class in ("online", "batch"):
            self.child(self.queued, pool, request_class)
            for reason in ("queue_full", "deadline_exceeded"):
                self.child(self.queue_refusals, pool, request_class, reason)


class _Discarded:
    """What `child` gives for a pod that left: every update is dropped."""

    def inc(self, amount: float = 1) -> None:
        return None

    def dec(self, amount: float = 1) -> None:
        return None

    def set(self, value: float) -> None:
        return None

    def observe(self, amount: float) -> None:
        return None


_DISCARDED = _Discarded()
