"""The real SGLang router accepts simulated pods as workers and routes to them.

Needs `sglang-router` (the `peers` extra); the pods serve a local tokenizer directory as their
model so the router loads it from disk instead of reaching for Hugging Face.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.integration.conftest import free_port
from tests.integration.sim.processes import SimFactory

pytest.importorskip("sglang_router", reason="sglang-router (the `peers` extra) is not installed")

TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "prefix" / "tokenizer"


def test_sglang_router_routes_to_simulated_pods(start_sim: SimFactory, tmp_path: Path) -> None:
    fleet = start_sim(
        "--model", str(TOKENIZER), "--served-model-name", "m", "--max-model-len", "4096",
        "--enable-prompt-tokens-details", pods=2,
    )  # fmt: skip
    port = free_port()
    log = (tmp_path / "sglang-router.log").open("wb")
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-host", "127.0.0.1",
         "--prometheus-port", str(free_port()), "--policy", "cache_aware",
         "--worker-urls", *fleet.urls()],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                assert router.poll() is None, (tmp_path / "sglang-router.log").read_text()
                try:
                    workers = client.get("/workers").json()
                    if sum(1 for w in workers.get("workers", []) if w.get("is_healthy")) == 2:
                        break
                except (httpx.TransportError, ValueError):
                    pass
                assert time.monotonic() < deadline, "the router never saw two healthy workers"
                time.sleep(0.2)
            text = "Summarise the routing design of a prefix-aware router. " * 30
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
            usages = []
            for _ in range(4):
                resp = client.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                usages.append(resp.json()["usage"])
            assert usages[0]["prompt_tokens"] > 300
            # cache_aware sends the repeats to the pod that served the first: full-block hits.
            assert all(u["prompt_tokens_details"]["cached_tokens"] > 0 for u in usages[1:])
            with client.stream(
                "POST", "/v1/completions",
                json={"model": "m", "prompt": text, "max_tokens": 3, "stream": True},
            ) as resp:  # fmt: skip
                lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and 2 <= len(lines) <= 4  # chunks may coalesce
    finally:
        router.terminate()
        try:
            router.wait(timeout=10)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait(timeout=5)
        log.close()
