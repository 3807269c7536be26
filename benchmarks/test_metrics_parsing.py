"""CPU per scrape of a simulated vLLM /metrics page: kvgate.promtext vs prometheus_client.

    .venv/bin/python -m pytest benchmarks/test_metrics_parsing.py --benchmark-only -q -s

The router scrapes every pod every `load_metrics.scrape_interval_seconds` (0.1 s): at 64 pods
that is 640 parses a second, so each case prints the share of one core that costs. The page is
tests/data/promtext/sim-metrics.txt (`kvgate sim serve` after three requests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.router.http.scrape import parse_load

PAGE = (Path(__file__).parents[1] / "tests" / "data" / "promtext" / "sim-metrics.txt").read_text()
SCRAPES_PER_SECOND = 64 * 10
WANTED = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_prefill_time_seconds_sum",
}


def _with_prometheus_client() -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(PAGE):
        for sample in family.samples:
            if sample.name in WANTED:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


CASES: dict[str, Callable[[], object]] = {
    "kvgate.promtext (router parse_load)": lambda: parse_load(PAGE, 0.0),
    "prometheus_client parser": _with_prometheus_client,
}


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_per_scrape(benchmark, case: str) -> None:  # type: ignore[no-untyped-def]
    parse = CASES[case]
    rounds = 500
    start = time.process_time()
    for _ in range(rounds):
        parse()
    per_scrape = (time.process_time() - start) / rounds
    print(
        f"\n{case}: {per_scrape * 1e6:.0f} us CPU per scrape; 64 pods every 100 ms: "
        f"{per_scrape * SCRAPES_PER_SECOND:.1%} of a core"
    )
    benchmark(parse)
