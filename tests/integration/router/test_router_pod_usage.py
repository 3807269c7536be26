"""A real `kvgate router` process in front of a pod (a real HTTP server) that states numbers no
float can hold: token counts in its answers' `usage`, +Inf request gauges and a 400-digit KV
cache size on its `/metrics`. The answers reach the client, the router reads those numbers as
absent or bounded and keeps routing (before, the answers raised OverflowError in the router's
metrics, and once the page was scraped every decision for the pool failed: `int(inf)`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from tests.integration.router.edge_helpers import RouterProcess, router_config

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


def _pod_handler(metrics: bytes) -> type[BaseHTTPRequestHandler]:
    class Pod(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(metrics if self.path == "/metrics" else b"", "text/plain")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self._send(ANSWER, "application/json")

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Pod


@contextlib.contextmanager
def _router_before_pod(metrics: bytes, tmp_path: Path) -> Iterator[RouterProcess]:
    """A router in front of one pod serving the given /metrics page."""
    pod = ThreadingHTTPServer(("127.0.0.1", 0), _pod_handler(metrics))
    threading.Thread(target=pod.serve_forever, daemon=True).start()
    proc = RouterProcess(tmp_path, router_config([f"http://127.0.0.1:{pod.server_port}"]))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
        pod.shutdown()
        pod.server_close()


def _no_traceback(proc: RouterProcess) -> None:
    log = proc.log_text()
    assert "OverflowError" not in log and "Traceback" not in log, log


def test_answers_with_absurd_token_counts_reach_the_client(tmp_path: Path) -> None:
    with (
        _router_before_pod(b"", tmp_path) as proc,
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
        _router_before_pod(METRICS, tmp_path) as proc,
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
