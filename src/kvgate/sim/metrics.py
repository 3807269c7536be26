"""One pod's ``/metrics``: vLLM's ``vllm:*`` names, labels and histogram buckets (vLLM 0.33).

Every pod owns a :class:`prometheus_client.CollectorRegistry` (a fleet process holds many pods).
Gauges and counters are read from the engine at scrape time by a collector, so the hot path
only observes histograms when a request produces tokens or finishes. All series carry
``model_name`` and ``engine`` labels as vLLM's do. Times are virtual (simulated GPU) seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.sim.engine import SimEngine, StepResult

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

LABELS = ("model_name", "engine")


class _EngineCollector(Collector):
    def __init__(self, engine: SimEngine, labels: tuple[str, str], cache_info: dict[str, str]):
        self._engine = engine
        self._labels = list(labels)
        self._cache_info = cache_info

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        engine, values = self._engine, self._labels
        stats = engine.stats

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = GaugeMetricFamily(name, doc, labels=list(LABELS))
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> Metric:
            c = CounterMetricFamily(name, doc, labels=list(LABELS))
            c.add_metric(values, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            engine.num_running,
        )  # fmt: skip
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            engine.num_waiting,
        )  # fmt: skip
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            engine.kv_cache.usage,
        )  # fmt: skip
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._cache_info),
        )
        info.add_metric(list(self._cache_info.values()), 1.0)
        yield info
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            stats.preemptions,
        )  # fmt: skip
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens
        )
        yield counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            stats.prompt_tokens_cached,
        )
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            stats.generation_tokens,
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        success.add_metric([*values, "length"], stats.finished_requests)
        yield success


class PodMetrics:
    """The registry behind one simulated pod's ``/metrics``."""

    def __init__(
        self, engine: SimEngine, model_name: str, cache_info: dict[str, str], engine_index: int = 0
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._engine = engine
        labels = (model_name, str(engine_index))
        self.registry.register(
            _EngineCollector(engine, labels, {**cache_info, "engine": str(engine_index)})
        )

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets)

        self._ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        ).labels(*labels)
        self._itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        ).labels(*labels)
        self._e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)
        self._queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)
        self._prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)

        # vLLM sets a new label set to the current (wall) time after every step; old label sets
        # stay exposed with their older times (kvgate.sim.lora).
        self._lora_info: Gauge | None = None
        if engine.config.lora is not None:
            self._lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=self.registry,
            )

    def observe_step(self, result: StepResult) -> None:
        if self._lora_info is not None and self._engine.config.lora is not None:
            running, waiting = self._engine.lora_adapters()
            self._lora_info.labels(
                str(self._engine.config.lora.max_loras), ",".join(waiting), ",".join(running)
            ).set_to_current_time()
        step = result.end - result.start
        for req, _token in result.tokens:
            if len(req.output_token_ids) == 1:
                self._ttft.observe(result.end - req.arrival_time)
                if req.first_scheduled_time is not None:
                    self._queue.observe(req.first_scheduled_time - req.arrival_time)
                    self._prefill.observe(result.end - req.first_scheduled_time)
            else:
                self._itl.observe(step)
        for req in result.finished:
            self._e2e.observe(result.end - req.arrival_time)
