"""A real `kvgate router` process in front of a pod (a real HTTP server) whose `/metrics` page is
hostile, scraped as fast as the router does by default or faster. The router keeps answering
other requests promptly, and what it keeps of the page stays bounded.

- LoRA: `vllm:lora_requests_info` states `max_lora="1000000000"` and names 1,024 adapters never
  seen before on every scrape. Before the bound the router remembered every name as possibly
  loaded on the pod (tens of thousands within seconds) and checked each new one against all of
  them: each scrape stalled the event loop for longer than the last.
- Size: a 16 MiB page (just under the limit on any body the router reads whole) of newlines.
  Before `load_metrics.max_page_bytes` it was parsed on the event loop every scrape, about 4 s
  each, and the next scrape began at once. A page just under that bound (2 MiB) is parsed in a
  thread: on the loop it held the router ~0.6 s a scrape (median /debug/route 0.6 s).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from tests.integration.router.edge_helpers import RouterProcess, canned_pod, router_before_pod

ADAPTER = "a0"  # the one adapter the router is configured with
LORA_LOAD_SECONDS = 0.05  # cost_model's default: a pod that may not hold the adapter costs this
NAMES_PER_SCRAPE = 1024
# Long names sharing all but their ends: each one compared against those held costs the most.
NAME_PREFIX = "x" * 200


_ANSWER = b'{"id":"c","object":"text_completion","model":"a0","choices":[]}'


def _add_adapter(config: dict[str, Any]) -> None:
    config["pools"][0]["lora_adapters"] = [{"name": ADAPTER, "path": f"/adapters/{ADAPTER}"}]


@contextlib.contextmanager
def _router_before_pod(metrics: Callable[[], bytes], tmp_path: Path) -> Iterator[RouterProcess]:
    """A router serving the adapter, in front of one pod whose /metrics page `metrics()`
    returns, scraped every 50 ms. Failed scrapes never eject the pod here (the router would not
    be ready while its one pod is out, and three fail within 150 ms)."""
    pod = canned_pod(lambda body: (_ANSWER, "application/json"), metrics)
    scrapes = {"scrape_interval_seconds": 0.05}
    never = {"eject_after_failures": 1_000_000}
    with router_before_pod(pod, tmp_path, _add_adapter, load_metrics=scrapes, limits=never) as (
        proc,
        _,
    ):
        yield proc


class NewAdaptersEveryScrape:
    """A /metrics page naming `NAMES_PER_SCRAPE` adapters not named before, each time it is read."""

    def __init__(self) -> None:
        self._scrapes = itertools.count()
        self.served = 0

    def __call__(self) -> bytes:
        scrape = next(self._scrapes)
        names = ",".join(f"{NAME_PREFIX}-{scrape}-{i}" for i in range(NAMES_PER_SCRAPE))
        self.served = scrape + 1
        return (
            f'vllm:lora_requests_info{{max_lora="1000000000",running_lora_adapters="{names}",'
            f'waiting_lora_adapters=""}} {time.time()}\n'
        ).encode()


def _route(client: httpx.Client, model: str = ADAPTER) -> tuple[float, dict[str, Any]]:
    """(seconds the router took to answer, the candidate pod's line) of a /debug/route."""
    started = time.monotonic()
    got = client.post("/debug/route", json={"model": model, "prompt": "hello"})
    elapsed = time.monotonic() - started
    assert got.status_code == 200, got.text
    [candidate] = got.json()["decision"]["candidates"]
    return elapsed, candidate


def _route_for(client: httpx.Client, seconds: float, model: str = ADAPTER) -> dict[str, Any]:
    """/debug/route every 10 ms for `seconds`: asserts their p99 latency stayed under 0.4 s
    (seconds before each fix) and returns the last candidate line."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        elapsed, candidate = _route(client, model)
        latencies.append(elapsed)
        time.sleep(0.01)
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 0.4, f"/debug/route p99 {p99:.3f} s, max {max(latencies):.3f} s"
    return candidate


def test_a_pod_naming_new_adapters_every_scrape_is_remembered_within_bounds(
    tmp_path: Path,
) -> None:
    page = NewAdaptersEveryScrape()
    with (
        _router_before_pod(page, tmp_path) as proc,
        httpx.Client(base_url=proc.url, timeout=30) as client,
    ):
        # the router sent the adapter there: it counts it as loaded on the pod for now
        sent = client.post("/v1/completions", json={"model": ADAPTER, "prompt": "hello"})
        assert sent.status_code == 200, sent.text
        scrapes_before = page.served
        candidate = _route_for(client, 8)
        scrapes = page.served - scrapes_before
    assert scrapes >= 20, f"only {scrapes} scrapes in 8 s"
    # 1,024 names newer than the adapter were seen: at most that many are kept, so the router
    # no longer assumes the pod holds it (the pod's max_lora of 10^9 is not believed)
    assert candidate["queue_seconds"] >= LORA_LOAD_SECONDS, candidate
    assert not proc.error_lines(), proc.log_text()


def test_a_page_over_the_size_limit_is_a_failed_scrape_never_parsed(tmp_path: Path) -> None:
    page = b'vllm:num_requests_running{model_name="m"} 1\n'
    page += b"\n" * ((16 << 20) - len(page) - 1)
    with (
        _router_before_pod(lambda: page, tmp_path) as proc,
        httpx.Client(base_url=proc.url, timeout=30) as client,
    ):
        errors_before = proc.metric("kvgate_router_scrape_errors_total")
        _route_for(client, 5, "m")
        errors = proc.metric("kvgate_router_scrape_errors_total") - errors_before
        assert errors >= 10, f"{errors} failed scrapes in 5 s"
    assert not proc.error_lines(), proc.log_text()


def test_a_page_just_under_the_size_limit_is_parsed_off_the_event_loop(tmp_path: Path) -> None:
    page = b'vllm:num_requests_running{model_name="m"} 7\n'
    page += b"\n" * ((2 << 20) - len(page) - 1)
    with (
        _router_before_pod(lambda: page, tmp_path) as proc,
        httpx.Client(base_url=proc.url, timeout=30) as client,
    ):
        candidate = _route_for(client, 5, "m")
        assert candidate["load"] >= 7, candidate  # the page was read
        assert proc.metric("kvgate_router_scrape_errors_total") == 0
    assert not proc.error_lines(), proc.log_text()
