"""The directory's Prometheus metrics, registered into a registry the application owns.

One `DirectoryMetrics` per registry; every series carries the pool (`<namespace>/<name>`).
Pods are deliberately not a label (unbounded cardinality); per-pod detail goes to logs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

SeriesKey = tuple[str, tuple[str, ...]]  # (metric name, label values)

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_BLOCK_BUCKETS = (0, 1, 4, 16, 64, 256, 1024, 4096, 16384)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class DirectoryMetrics:
    """Counters, gauges and histograms of the directory and its KV-event indexer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self.operations = counter(
            "kvgate_directory_operations_total",
            "Directory operations by outcome (ok | stale | error)",
            ["pool", "operation", "outcome"],
        )
        self.operation_seconds = Histogram(
            "kvgate_directory_operation_duration_seconds",
            "Latency of directory operations",
            ["pool", "operation"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.lookup_matched_blocks = Histogram(
            "kvgate_directory_lookup_matched_blocks",
            "Longest match (blocks) of a lookup over all pods",
            ["pool"],
            buckets=_BLOCK_BUCKETS,
            registry=registry,
        )
        self.blocks_written = counter(
            "kvgate_directory_blocks_written_total",
            "Block keys written (add | remove | add_approximate)",
            ["pool", "operation"],
        )
        self.pods = Gauge("kvgate_directory_pods", "Known pods", ["pool"], registry=registry)
        self.entries = Gauge(
            "kvgate_directory_entries",
            "(block, pod) entries (kind: exact | approximate)",
            ["pool", "kind"],
            registry=registry,
        )
        self.event_batches = counter(
            "kvgate_directory_event_batches_total", "KV event batches applied", ["pool"]
        )
        self.events = counter(
            "kvgate_directory_events_total", "KV events applied by type", ["pool", "type"]
        )
        self.bad_events = counter(
            "kvgate_directory_bad_events_total",
            "KV event payloads, frames or events skipped, by reason",
            ["pool", "reason"],
        )
        self.event_lag = Histogram(
            "kvgate_directory_event_lag_seconds",
            "Time from a KV event batch's engine timestamp to its receipt by the subscriber",
            ["pool"],
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.seq_gaps = counter(
            "kvgate_directory_event_seq_gaps_total", "Gaps detected in KV event seq", ["pool"]
        )
        self.replays = counter(
            "kvgate_directory_event_replays_total",
            "Replays from a pod's replay socket (outcome: ok | partial | failed)",
            ["pool", "outcome"],
        )
        self.pod_clears = counter(
            "kvgate_directory_pod_clears_total",
            "Pods cleared (reason: restart | gap | all_blocks_cleared | lost_removal | removed | start)",
            ["pool", "reason"],
        )
        # The indexer's own fallback to its local view while Redis is down (a router counts
        # these as kvgate_router_directory_*, labelled by its policy in dashboards).
        self.fallback_errors = counter(
            "kvgate_directory_fallback_errors_total",
            "Shared-directory operations that failed (the local view was used)",
            ["operation"],
        )
        self.fallback_degraded = Gauge(
            "kvgate_directory_fallback_degraded",
            "1 while the shared directory is unreachable and the local view is used",
            registry=registry,
        )
        self.subscriptions = Gauge(
            "kvgate_directory_subscriptions", "Running KV event subscriptions", ["pool"],
            registry=registry,
        )  # fmt: skip

    def forget_pool(self, pool: str) -> None:
        """Remove the series of `pool`, which left the configuration (its index is closed)."""
        remove_series(vars(self).values(), "pool", pool)


def remove_series(collectors: Iterable[object], label: str, value: str) -> set[SeriesKey]:
    """Remove every series of `collectors` (prometheus_client metrics; other objects are
    skipped) whose `label` is `value`, e.g. a pool's once it left the configuration. Returns
    the (metric name, label values) of each removed series."""
    removed: set[SeriesKey] = set()
    for metric in collectors:
        if not isinstance(metric, MetricWrapperBase) or label not in metric._labelnames:
            continue
        at = metric._labelnames.index(label)
        with metric._lock:
            stale = [values for values in metric._metrics if values[at] == value]
        for values in stale:
            metric.remove(*values)
            removed.add((metric._name, tuple(values)))
    return removed


class LogOnce:
    """Log a problem at WARNING the first time a key is seen, then at DEBUG (bounded memory)."""

    def __init__(self, logger: logging.Logger, capacity: int = 1024) -> None:
        self._logger = logger
        self._seen: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._capacity = capacity

    def warning(self, key: tuple[str, ...], msg: str, *args: object) -> None:
        if key in self._seen:
            self._logger.debug(msg, *args)
            return
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        self._logger.warning(msg + " (logged once; counted in metrics)", *args)
