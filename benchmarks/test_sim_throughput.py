"""How fast the simulator runs, so that it is never the bottleneck of a benchmark.

    .venv/bin/python -m pytest benchmarks/test_sim_throughput.py --benchmark-only -q -s

- HTTP, one pod and a 16-pod fleet (`kvgate sim serve|fleet` subprocesses): requests per second
  for short completions (32-token prompt, 4 output tokens), with 64 keep-alive connections from
  a raw asyncio client (cheaper than any HTTP library, so the server is what is measured). The
  simulated GPU runs 100x faster than real time (`--sim-time-scale 0.01`).
- Discrete-event mode: 64 pods, 1024-token prompts over 200 shared prefixes + 64-token tails,
  32 output tokens, Poisson arrivals at 4 req/s per pod, longest-prefix routing; simulated
  requests per wall second and per CPU second.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from benchmarks.directory_common import report
from tests.integration.conftest import free_port
from tests.integration.sim.processes import SimProcess

from kvgate.sim.des import DESFleet, PodState, TraceRequest, routed_by
from kvgate.sim.engine import EngineConfig
from kvgate.sim.profile import H100_LLAMA3_8B

CONNECTIONS = 64
DURATION_SECONDS = 5.0


async def _connection(port: int, body: bytes, stop_at: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    try:
        while time.monotonic() < stop_at:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            counts[0] += 1
    finally:
        writer.close()


async def _load(ports: list[int]) -> float:
    body = json.dumps({"model": "m", "prompt": list(range(1000, 1032)), "max_tokens": 4}).encode()
    counts = [0]
    start = time.monotonic()
    stop_at = start + DURATION_SECONDS
    await asyncio.gather(
        *(_connection(ports[i % len(ports)], body, stop_at, counts) for i in range(CONNECTIONS))
    )
    return counts[0] / (time.monotonic() - start)


def _serve(tmp_path: Path, pods: int) -> SimProcess:
    flags = ["--model", "m", "--max-model-len", "4096", "--sim-time-scale", "0.01"]
    if pods == 1:
        port = free_port()
        args = ["serve", "--host", "127.0.0.1", "--port", str(port), *flags]
        ports = [port]
    else:
        base = free_port()
        args = ["fleet", "--pods", str(pods), "--base-port", str(base), *flags]
        ports = [base + i for i in range(pods)]
    proc = SimProcess(args, ports, tmp_path / "sim.log")
    proc.wait_ready()
    return proc


@pytest.mark.parametrize("pods", [1, 16])
def test_http_requests_per_second(benchmark, tmp_path: Path, pods: int) -> None:  # type: ignore[no-untyped-def]
    proc = _serve(tmp_path, pods)
    try:
        rate = benchmark.pedantic(lambda: asyncio.run(_load(proc.ports)), rounds=1, iterations=1)
    finally:
        proc.stop()
    benchmark.extra_info["requests_per_second"] = rate
    report(f"sim HTTP, {pods} pod(s), {CONNECTIONS} connections", {"req_per_s": rate})


def _longest_prefix(request: TraceRequest, pods: list[PodState], now: float) -> int:
    return min(
        pods, key=lambda p: (-p.cached_prefix_tokens, p.num_running + p.num_waiting, p.index)
    ).index


def test_des_simulated_requests_per_second(benchmark) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    pods, n = 64, 5000
    prefixes = [[rng.randrange(100, 30000) for _ in range(1024)] for _ in range(200)]
    trace, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(4.0 * pods)
        tail = [rng.randrange(100, 30000) for _ in range(64)]
        trace.append(TraceRequest(f"r{i}", t, prefixes[rng.randrange(200)] + tail, 32))

    def run() -> tuple[float, float]:
        fleet = DESFleet(pods, EngineConfig(), H100_LLAMA3_8B)
        wall, cpu = time.perf_counter(), time.process_time()
        result = fleet.run(trace, routed_by(_longest_prefix))
        assert len(result.records) == n
        return time.perf_counter() - wall, time.process_time() - cpu

    wall, cpu = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(per_wall_second=n / wall, per_cpu_second=n / cpu)
    report(
        f"sim DES, {pods} pods, {n} requests",
        {"req_per_wall_s": n / wall, "req_per_cpu_s": n / cpu},
    )
