"""Every dashboard query returns data from a real Prometheus scraping a live kvgate stack.

A simulated fleet (3 pods publishing KV events), a slow fourth pod, `kvgate indexer` and
`kvgate router` on a real redis-server, and Debian's `prometheus` scraping every second. Agent-like
sessions (token-id prompts that grow turn by turn, one session rewriting its history) go through
the router for a few seconds; the slow pod is killed while it has requests in flight (upstream
errors, retries) and one prompt is too long for the engines (HTTP 400). Then every PromQL
expression of every panel runs against Prometheus with the template variables set to All: each
must return a non-NaN sample, and the hit-rate panel must agree with the engines' own counters.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_stack import MODEL, NAMESPACE, POLICY, POOL_KEY, Stack
from tests.integration.conftest import RedisServer
from tests.unit.chart.dashboard_queries import names, panel_queries, substitute, variable_queries

pytestmark = pytest.mark.slow

SESSIONS = 8
TURNS = 6
BREAKS = {0: 0, 1: 2, 2: 4}  # session -> turn after which it rewrites its history
THINK_SECONDS = 0.3  # between turns: the load spans several scrapes
WINDOW = "60s"  # covers the whole load: rate() over it is the run's average


def session_prompts(session: int, rng: random.Random) -> list[list[int]]:
    """Token ids of each turn: a shared system prefix, then this session's growing history."""
    system = list(range(100, 100 + 160))
    history = [1000 + session * 2_000 + i for i in range(48)]
    turns = []
    for turn in range(TURNS):
        turns.append(system + history)
        history = history + [rng.randrange(20_000, 30_000) for _ in range(48)]
        if turn == BREAKS.get(session):  # rewrites its history: a prefix break next turn
            history = [7] * 16 + history[16:]
    return turns


async def run_session(client: httpx.AsyncClient, url: str, session: int) -> list[int]:
    rng = random.Random(session)
    codes = []
    stream = session % 2 == 1  # the router measures TTFT on streams
    for prompt in session_prompts(session, rng):
        body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        response = await client.post(
            url + "/v1/completions", json=body, headers={"x-session-id": f"s{session}"}
        )
        codes.append(response.status_code)
        await asyncio.sleep(THINK_SECONDS)
    return codes


def victim_inflight(metrics: str, victim: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("kvgate_router_inflight_requests{") and f'upstream="{victim}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def kill_victim_under_load(stack: Stack, client: httpx.AsyncClient) -> bool:
    """Kill the slow pod as soon as the router has a request in flight to it."""
    assert stack.victim is not None
    victim = stack.victim_url.split("://", 1)[1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = (await client.get(stack.router_url + "/metrics")).text
        if victim_inflight(metrics, victim) > 0:
            stack.victim.kill()
            return True
        await asyncio.sleep(0.02)
    stack.victim.kill()
    return False


async def drive_load(stack: Stack) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as client:
        killer = asyncio.create_task(kill_victim_under_load(stack, client))
        results = await asyncio.gather(
            *(run_session(client, stack.router_url, s) for s in range(SESSIONS))
        )
        killed_in_flight = await killer
        too_long = await client.post(
            stack.router_url + "/v1/completions",
            json={"model": MODEL, "prompt": list(range(2000)), "max_tokens": 4},
        )
        return {"codes": results, "killed_in_flight": killed_in_flight, "too_long": too_long}


def engine_counters(urls: list[str]) -> tuple[float, float]:
    """(prefix cache hits, queries) summed over the pods' own /metrics."""
    hits = queries = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def query(stack: Stack, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(stack.prometheus_url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_until(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def loaded_stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, dict[str, Any]]]:
    workdir: Path = tmp_path_factory.mktemp("dashboards")
    redis = RedisServer(workdir / "redis")
    redis.start()
    stack = Stack(workdir)
    try:
        stack.start(redis.url)
        time.sleep(0.5)  # ZMQ subscriptions connect before the first events (slow joiner)
        outcome = asyncio.run(drive_load(stack))
        sent = SESSIONS * TURNS + 1

        def scraped_all() -> bool:
            found = query(stack, f'sum(kvgate_router_requests_total{{namespace="{NAMESPACE}"}})')
            return bool(found) and float(found[0]["value"][1]) >= sent

        wait_until(scraped_all, 15, "Prometheus to scrape every request")

        def indexer_saw_pods() -> bool:
            found = query(stack, "sum(kvgate_directory_pods)")
            return bool(found) and float(found[0]["value"][1]) > 0

        wait_until(indexer_saw_pods, 15, "the indexer's directory size gauges")
        time.sleep(1.5)  # one more scrape of every target after the last change
        outcome["engine_counters"] = engine_counters(stack.fleet_urls)
        yield stack, outcome
    finally:
        stack.stop()
        redis.stop()


def test_the_load_went_through_the_router(loaded_stack: tuple[Stack, dict[str, Any]]) -> None:
    _stack, outcome = loaded_stack
    assert all(code == 200 for codes in outcome["codes"] for code in codes), outcome["codes"]
    assert outcome["killed_in_flight"], "the slow pod never had a request in flight"
    assert outcome["too_long"].status_code == 400, outcome["too_long"].text


@pytest.mark.parametrize("dashboard", names())
def test_every_panel_query_returns_data(
    loaded_stack: tuple[Stack, dict[str, Any]], dashboard: str
) -> None:
    stack, _ = loaded_stack
    empty = []
    for panel in [q for q in panel_queries() if q.dashboard == dashboard]:
        expr = substitute(panel.expr, rate_interval=WINDOW, range_=WINDOW)
        samples = query(stack, expr)
        values = [float(s["value"][1]) for s in samples]
        if not values or all(math.isnan(v) for v in values):
            empty.append(f"{panel.name}: {expr} -> {samples}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


@pytest.mark.parametrize("dashboard", names())
def test_template_variables_offer_the_stack_values(
    loaded_stack: tuple[Stack, dict[str, Any]], dashboard: str
) -> None:
    stack, _ = loaded_stack
    expected = {"namespace": NAMESPACE, "policy": POLICY, "pool": POOL_KEY}
    for var, (selector, label) in variable_queries(dashboard).items():
        series = query(stack, substitute(selector, WINDOW, WINDOW))
        assert expected[var] in {s["metric"].get(label) for s in series}, var


def test_hit_rate_panel_agrees_with_engine_counters(
    loaded_stack: tuple[Stack, dict[str, Any]],
) -> None:
    stack, outcome = loaded_stack
    hits, queries = outcome["engine_counters"]
    assert queries > 0 and 0 < hits < queries
    truth = hits / queries
    panel = next(
        q for q in panel_queries()
        if q.dashboard == "overview" and q.panel.startswith("Prefix hit rate: router-predicted")
    )  # fmt: skip
    # The whole run in one window (increase over it, as the stat panel does over $__range).
    stat = next(q for q in panel_queries() if q.panel == "Prefix hit rate (engines)")
    (sample,) = query(stack, substitute(stat.expr, WINDOW, "5m"))
    assert float(sample["value"][1]) == pytest.approx(truth, abs=0.01)
    # The time series: router-predicted, engine-reported through usage, engine counters.
    by_ref = {}
    for target in [q for q in panel_queries() if q.panel == panel.panel]:
        (series,) = query(stack, substitute(target.expr, "5m", "5m"))
        by_ref[target.ref_id] = float(series["value"][1])
    assert by_ref["C"] == pytest.approx(truth, abs=0.01)  # engine counters
    assert by_ref["B"] == pytest.approx(truth, abs=0.05)  # usage.cached_tokens via the router
    assert 0 < by_ref["A"] <= 1  # what the router predicted
