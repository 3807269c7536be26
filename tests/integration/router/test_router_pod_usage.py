"""A real `kvgate router` process in front of a pod (a real HTTP server) that states numbers no
float can hold: token counts in its answers' `usage`, +Inf request gauges and a 400-digit KV
cache size on its `/metrics`. The answers reach the client, the router reads those numbers as
absent or bounded and keeps routing (before, the answers raised OverflowError in the router's
metrics, and once the page was scraped every decision for the pool failed: `int(inf)`)."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
from tests.integration.router.edge_helpers import RouterProcess, canned_pod, router_before_pod

HUGE = int("9" * 400)  # JSON allows it; float(HUGE) raises OverflowError
METRICS = (
    'vllm:num_requests_waiting{model_name="m"} +Inf\n'
    'vllm:num_requests_running{model_name="m"} +Inf\n'
    'vllm:kv_cache_usage_perc{model_name="m"} +Inf\n'
    f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{HUGE}"}} 1.0\n'
).encode()
ANSWER = json.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": HUGE,
            "completion_tokens": HUGE,
            "prompt_tokens_details": {"cached_tokens": HUGE},
        },
    }
).encode()


def _pod(metrics: bytes) -> type[BaseHTTPRequestHandler]:
    """A pod whose `/metrics` page is `metrics` and whose answers state absurd token counts."""
    return canned_pod(lambda body: (ANSWER, "application/json"), lambda: metrics)


def _no_traceback(proc: RouterProcess) -> None:
    log = proc.log_text()
    assert "OverflowError" not in log and "Traceback" not in log, log


def test_answers_with_absurd_token_counts_reach_the_client(tmp_path: Path) -> None:
    with (
        router_before_pod(_pod(b""), tmp_path) as (proc, _),
        httpx.Client(base_url=proc.url, timeout=10) as client,
    ):
        for _ in range(3):
            got = client.post("/v1/completions", json={"model": "m", "prompt": "hello"})
            assert got.status_code == 200
            assert got.json()["choices"][0]["text"] == "hi"
        assert client.get("/metrics").status_code == 200
    _no_traceback(proc)


def test_absurd_load_gauges_and_cache_size_are_bounded(tmp_path: Path) -> None:
    with (
        router_before_pod(_pod(METRICS), tmp_path) as (proc, _),
        httpx.Client(base_url=proc.url, timeout=10) as client,
    ):
        deadline = time.monotonic() + 10
        while True:  # until /debug/route shows the scraped load (+Inf, bounded)
            got = client.post("/debug/route", json={"model": "m", "prompt": "hello"})
            assert got.status_code == 200, got.text
            [candidate] = got.json()["decision"]["candidates"]
            if candidate["load"] >= 1_000_000:
                break
            assert time.monotonic() < deadline, "the pod's /metrics were never applied"
            time.sleep(0.05)
        # a pod that says it queues a million requests is full: the request waits for room
        # until its deadline, and is refused cleanly
        got = client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "hello"},
            headers={"x-kvgate-deadline-ms": "300"},
        )
        assert got.status_code == 429, got.text
    _no_traceback(proc)
