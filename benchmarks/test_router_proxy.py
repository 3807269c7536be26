"""Proxy overhead and small-request throughput of one router process (and of the SGLang router).

    .venv/bin/python -m pytest benchmarks/test_router_proxy.py --benchmark-only -q -s

A trivial upstream (raw ASGI on uvicorn + httptools, answering a fixed OpenAI completion and an
empty /metrics) stands in for the pods, so that only the router's own cost is measured. The load
generator is a minimal keep-alive HTTP/1.1 client on raw asyncio streams (no HTTP library), so
that it is not the bottleneck:

- overhead: one connection, closed loop (moderate load), latency p50/p99 direct to the upstream
  vs through the router; the difference of the p50s is the router's added latency;
- throughput: 32 connections, closed loop, for `DURATION` seconds, through the router
  (`kvgate router --policy kvgate`, default settings) and through `sglang-router` with
  `--policy cache_aware` when it is installed (the `peers` extra).

Every process runs on this machine (the CPUs are shared by the client, router and upstream).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.conftest import free_port

DURATION = 5.0
BODY = b'{"model":"m","messages":[{"role":"user","content":"Say hi."}],"max_tokens":4}'

UPSTREAM = textwrap.dedent(
    """
    import json, sys, uvicorn
    ANSWER = json.dumps({"id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13,
                  "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
    INFO = json.dumps({"model_path": "m", "served_model_name": "m"}).encode()
    MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            if not message.get("more_body"):
                break
        path = scope["path"]
        body, ctype = ANSWER, b"application/json"
        if path == "/metrics":
            body, ctype = b"vllm:num_requests_running 0\\n", b"text/plain"
        elif path in ("/health", "/health_generate"):
            body = b"{}"
        elif path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            body = INFO
        elif path == "/v1/models":
            body = MODELS
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop",
                http="httptools", log_level="error", access_log=False)
    """
)


class Proc:
    def __init__(self, args: list[str], port: int, log: Path, health: str = "/health") -> None:
        self.port = port
        self._log = log.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{args[0]} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1).status_code < 500:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{args[0]} did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


async def _client(port: int, stop_at: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
    )
    done = 0
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            done += 1
    finally:
        writer.close()
    return done


def _load(port: int, connections: int, duration: float) -> tuple[float, list[float]]:
    async def run() -> tuple[float, list[float]]:
        latencies: list[float] = []
        await _client(port, time.perf_counter() + 0.5, [])  # warm the connection pools
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(_client(port, start + duration, latencies) for _ in range(connections))
        )
        return sum(counts) / (time.perf_counter() - start), latencies

    return asyncio.run(run())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(proc: Proc, connections: int) -> dict[str, float]:
    """Throughput, latency and the router process's CPU per request (load-independent)."""
    before = _cpu_seconds(proc.proc.pid)
    rate, latencies = _load(proc.port, connections, DURATION)
    cpu_ms = (_cpu_seconds(proc.proc.pid) - before) / max(1, len(latencies)) * 1000
    return {
        "requests_per_s": rate,
        "p50_ms": _p(latencies, 0.5),
        "cpu_ms_per_request": cpu_ms,
        "requests_per_cpu_second": 1000 / cpu_ms if cpu_ms > 0 else float("inf"),
    }


def _p(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    work = tmp_path_factory.mktemp("router-proxy")
    script = work / "upstream.py"
    script.write_text(UPSTREAM)
    port = free_port()
    proc = Proc([sys.executable, str(script), str(port)], port, work / "upstream.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def kvgate_router(upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    kvgate = str(Path(sys.executable).with_name("kvgate"))
    args = [kvgate, "--log-level", "WARNING", "router", "--endpoint",
            f"http://127.0.0.1:{upstream.port}", "--model", "m", "--host", "127.0.0.1",
            "--port", str(port)]  # fmt: skip
    proc = Proc(args, port, tmp_path_factory.mktemp("kvgate-router") / "router.log", "/ready")
    yield proc
    proc.stop()


def test_proxy_overhead(benchmark: Any, upstream: Proc, kvgate_router: Proc) -> None:
    def measure() -> dict[str, float]:
        _, direct = _load(upstream.port, 1, DURATION / 2)
        _, routed = _load(kvgate_router.port, 1, DURATION / 2)
        return {
            "direct_p50_ms": _p(direct, 0.5),
            "direct_p99_ms": _p(direct, 0.99),
            "router_p50_ms": _p(routed, 0.5),
            "router_p99_ms": _p(routed, 0.99),
            "added_p50_ms": _p(routed, 0.5) - _p(direct, 0.5),
        }

    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    shown = {k: round(v, 3) for k, v in result.items()}
    print("\nproxy overhead (1 connection):", shown)  # noqa: T201


def test_throughput_kvgate(benchmark: Any, kvgate_router: Proc) -> None:
    result = benchmark.pedantic(lambda: _measure(kvgate_router, 32), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    shown = {k: round(v, 3) for k, v in result.items()}
    print("\nkvgate router (32 connections):", shown)  # noqa: T201


def test_throughput_sglang(
    benchmark: Any, upstream: Proc, tmp_path_factory: pytest.TempPathFactory
) -> None:
    binary = shutil.which(
        "sglang-router",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    if binary is None:
        pytest.skip("sglang-router is not installed (pip install -e '.[peers]')")
    port = free_port()
    args = [binary, "launch", "--worker-urls", f"http://127.0.0.1:{upstream.port}",
            "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    proc = Proc(args, port, tmp_path_factory.mktemp("sglang") / "sglang.log", "/health")
    try:
        result = benchmark.pedantic(lambda: _measure(proc, 32), rounds=1, iterations=1)
    finally:
        proc.stop()
    benchmark.extra_info.update(result)
    shown = {k: round(v, 3) for k, v in result.items()}
    print("\nsglang-router cache_aware (32 connections):", shown)  # noqa: T201
