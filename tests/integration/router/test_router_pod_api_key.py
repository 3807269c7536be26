"""A real router in front of a real HTTP pod started with an API key (`vllm serve --api-key`):
the router sends the pool's key on every request it makes there, never the client's."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import completion_answer, router_before_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ANSWER = completion_answer()


class KeyedPod(BaseHTTPRequestHandler):
    """vLLM's `--api-key` check: `/v1/*` needs `Authorization: Bearer sk-pod` (its /metrics
    and /tokenize do not). Records each POST's headers."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self._send(200, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        KeyedPod.seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.path.startswith("/v1") and self.headers.get("authorization") != "Bearer sk-pod":
            self._send(401, b'{"error": "Unauthorized"}')
        else:
            self._send(200, ANSWER if self.path.startswith("/v1") else b'{"tokens": [1]}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _with_key(config: dict[str, Any]) -> None:
    config["pools"][0]["engine"] = {"api_key": {"value": "sk-pod"}}


async def test_the_pools_key_reaches_its_pods_and_the_clients_does_not(tmp_path: Path) -> None:
    KeyedPod.seen.clear()
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with router_before_pod(KeyedPod, tmp_path, edit=_with_key) as (proc, _pod):
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
            headers = {"authorization": "Bearer sk-client", "traceparent": trace}
            body = {"model": "m", "prompt": "hello", "max_tokens": 1}
            got = await client.post("/v1/completions", json=body, headers=headers)
            assert got.status_code == 200, got.text
            relayed = await client.post("/tokenize", json={"model": "m", "prompt": "hello"})
            assert relayed.status_code == 200, relayed.text
    completion, tokenize = KeyedPod.seen
    assert completion["authorization"] == tokenize["authorization"] == "Bearer sk-pod"
    assert completion["traceparent"] == trace


def test_an_empty_pod_key_is_a_config_error(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("\n")

    def edit(config: dict[str, Any]) -> None:
        config["pools"][0]["engine"] = {"api_key": {"file": str(key_file)}}

    error = r"router exited: .*engine\.api_key is empty"
    with (
        pytest.raises(AssertionError, match=error),
        router_before_pod(KeyedPod, tmp_path, edit=edit),
    ):
        pass
