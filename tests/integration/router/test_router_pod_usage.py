"""A real `kvgate router` process in front of a pod (a real HTTP server) whose answers carry
token counts no float can hold: the answers reach the client, and the router learns nothing
from them and keeps routing (before, the first such answer raised OverflowError in the
router's metrics)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from tests.integration.router.edge_helpers import RouterProcess, router_config

HUGE = int("9" * 400)  # JSON allows it; float(HUGE) raises OverflowError
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


class _Pod(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._send(b"", "text/plain")

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


@pytest.fixture
def pod() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pod)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_pods_absurd_usage_counts_are_read_as_absent(pod: str, tmp_path: Path) -> None:
    router = RouterProcess(tmp_path, router_config([pod]))
    try:
        router.wait_ready()
        with httpx.Client(base_url=router.url, timeout=10) as client:
            for _ in range(3):
                got = client.post("/v1/completions", json={"model": "m", "prompt": "hello"})
                assert got.status_code == 200
                assert got.json()["choices"][0]["text"] == "hi"
            metrics = client.get("/metrics")
            assert metrics.status_code == 200
        log = router.log_text()
        assert "OverflowError" not in log and "Traceback" not in log, log
    finally:
        router.stop()
