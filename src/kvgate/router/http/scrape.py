"""Scrape every endpoint's vLLM /metrics for load, and use the result as an active health check.

Every `interval` the scraper fetches all endpoints' /metrics concurrently (each bounded by a
timeout), parses the three gauges routing needs (`vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, summed over label sets) and, on pods
serving LoRA adapters, `vllm:lora_requests_info` (the newest of its label sets: vLLM sets a new
one to the current time after each step and leaves the old ones exposed; its labels
`running_lora_adapters` / `waiting_lora_adapters` are comma-joined adapter names, `max_lora` the
adapters a batch may use), and whether its KV cache has filled (`vllm:cache_config_info`'s
`num_gpu_blocks` x `block_size` against the tokens written into it since the engine started:
`vllm:prefix_cache_queries` - `vllm:prefix_cache_hits` + `vllm:generation_tokens`), and stores
them with the time of the scrape. Both a scrape and its failure go to the routing core, which
owns endpoint state: a failed scrape counts as a health failure there (enough in a row eject the
pod until it answers again), and so does a page over `max_page_bytes`, which is never parsed;
pages over `INLINE_PAGE_CHARS` are parsed in a thread, the others on the event loop. Load older
than `stale_after` is treated as unknown by the scoring snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

from kvgate.discovery.endpoints import Endpoint, EndpointSet, LoadSample
from kvgate.promtext import newest_sample, samples_named, sum_samples
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.http.upstream import Upstream, UpstreamError, read_all
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_WANTED = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    # vLLM < 0.10 spelled it gpu_cache_usage_perc.
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
}
# The tokens an engine writes into its KV cache: prompt tokens computed (queried less those
# found cached) and tokens generated (LoadSample.kv_filled).
_QUERIES, _HITS, _GENERATED = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:generation_tokens_total",
)
CACHE_INFO = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
# LoRA adapter names kept per pod: a label's length is bounded by the page, its names by this
# count, and so is max_lora (the adapters the router remembers a pod used last: vLLM's
# --max-loras is a few, the operator allows 256).
MAX_LORA_ADAPTERS = 1024
MAX_LORA_NAME_CHARS = 253
MAX_REQUESTS_GAUGE = 1e6  # requests one engine runs or queues, at most (beyond: this many)
MAX_KV_CAPACITY_TOKENS = 1 << 40  # one engine's cache beyond this is nonsense: read as unknown
# Pages parsed on the event loop, at most: vLLM's (~100 KiB) costs ~0.06 ms, this much of empty
# lines ~20 ms. Larger ones (up to max_page_bytes) are parsed in a thread, holding the GIL in
# slices only: 2 MiB of empty lines held the loop 0.35 s.
INLINE_PAGE_CHARS = 128 * 1024
MAX_CACHED_LINE_CHARS = 4096  # vllm:cache_config_info lines parsed once (256 kept: <= 1 MiB)


def parse_load(text: str, now: float) -> LoadSample:
    """Extract the load gauges from Prometheus text exposition; missing ones read as 0."""
    values: dict[str, float] = {"waiting": 0.0, "running": 0.0, "kv_cache_usage": 0.0}
    found = sum_samples(text, (*_WANTED, _QUERIES, _HITS, _GENERATED))  # one pass over the page
    for name, field in _WANTED.items():
        if name in found:
            values[field] += found[name]
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    max_lora = 0
    info = newest_sample(text, LORA_INFO)
    if info is not None:
        running = _adapter_names(info.labels.get("running_lora_adapters", ""))
        waiting = _adapter_names(info.labels.get("waiting_lora_adapters", ""))
        with contextlib.suppress(ValueError):
            max_lora = min(max(0, int(info.labels.get("max_lora", "0"))), MAX_LORA_ADAPTERS)
    written = None
    if _QUERIES in found and _HITS in found and _GENERATED in found:
        written = max(0.0, found[_QUERIES] - found[_HITS]) + max(0.0, found[_GENERATED])
    return LoadSample(
        waiting=_gauge(values["waiting"], MAX_REQUESTS_GAUGE),
        running=_gauge(values["running"], MAX_REQUESTS_GAUGE),
        kv_cache_usage=_gauge(values["kv_cache_usage"], 1.0),
        scraped_at=now,
        running_lora_adapters=running,
        waiting_lora_adapters=waiting,
        max_lora=max_lora,
        kv_capacity_tokens=kv_capacity_tokens(text),
        kv_written_tokens=written,
    )


def _gauge(value: float, top: float) -> float:
    """A gauge within [0, top] (NaN reads 0): routing turns request counts into ints and
    prices usage as a fraction, and a pod may state +Inf."""
    return min(max(value, 0.0), top) if value == value else 0.0


def kv_capacity_tokens(text: str) -> int:
    """The KV cache's size in tokens, from `vllm:cache_config_info`'s labels `num_gpu_blocks`
    and `block_size` (summed over its label sets: one per engine of a data-parallel pod); 0
    when no label set states both as positive integers (vLLM states "None" before the cache is
    allocated). The lines are found without splitting the page, and each is parsed once: they
    do not change between scrapes."""
    total = 0
    start = text.find(CACHE_INFO)
    while start >= 0:
        end = text.find("\n", start)
        if start == 0 or text[start - 1] == "\n":
            line = text[start : end if end >= 0 else len(text)]
            cached = len(line) <= MAX_CACHED_LINE_CHARS
            total += _cached_line_capacity(line) if cached else _line_capacity(line)
        start = text.find(CACHE_INFO, start + 1) if end >= 0 else -1
    return total


def _line_capacity(line: str) -> int:
    for sample in samples_named(line, CACHE_INFO):
        try:
            blocks = int(sample.labels.get("num_gpu_blocks", ""))
            block_size = int(sample.labels.get("block_size", ""))
        except ValueError:  # "None", or too many digits for int()
            return 0
        if blocks > 0 and block_size > 0:
            capacity = blocks * block_size
            # a float must hold it (policies divide by it and scale it)
            return capacity if capacity <= MAX_KV_CAPACITY_TOKENS else 0
    return 0


_cached_line_capacity = functools.lru_cache(maxsize=256)(_line_capacity)


def _adapter_names(label: str) -> frozenset[str]:
    names = (n.strip() for n in label.split(",", MAX_LORA_ADAPTERS)[:MAX_LORA_ADAPTERS])
    return frozenset(n for n in names if n and len(n) <= MAX_LORA_NAME_CHARS)


class LoadScraper:
    """An owned background task: start() once, stop() on shutdown. What a scrape finds goes to
    the routing core (`load_scraped` / `scrape_failed`), which owns endpoint state."""

    def __init__(
        self,
        endpoints: EndpointSet,
        upstream: Upstream,
        core: RoutingCore,
        *,
        interval: float,
        timeout: float,
        path: str = "/metrics",
        max_page_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoints = endpoints
        self._upstream = upstream
        self._core = core
        self.interval = interval
        self.timeout = timeout
        self.path = path
        self.max_page_bytes = max_page_bytes
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-load-scraper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def scrape_once(self) -> None:
        endpoints = self._endpoints.all()
        if endpoints:
            await asyncio.gather(*(self._scrape(ep) for ep in endpoints))

    async def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.scrape_once()
            except Exception:  # a bug here must not stop load tracking for good
                log.exception("load scrape round failed")
            await asyncio.sleep(max(0.0, self.interval - (self._clock() - started)))

    async def _scrape(self, ep: Endpoint) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._upstream.request(
                    "GET",
                    ep.spec.url + self.path,
                    b"",
                    [],
                    connect_timeout=self.timeout,
                    head_timeout=self.timeout,
                )
                page = await read_all(response, self.max_page_bytes)  # larger: a failure
                text = page.decode("utf-8", "replace")
            if response.status != 200:
                raise UpstreamError("status", f"HTTP {response.status}")
        except (UpstreamError, TimeoutError) as exc:
            self._core.scrape_failed(ep, exc)
            return
        if len(text) <= INLINE_PAGE_CHARS:
            sample = parse_load(text, self._clock())
        else:  # the loop serves requests meanwhile (parsing holds the GIL only in slices)
            sample = await asyncio.to_thread(parse_load, text, self._clock())
        self._core.load_scraped(ep, sample)
