"""Shared helpers of the directory benchmarks (a real redis-server, latency percentiles)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from tests.integration.conftest import RedisServer

PODS = 16
CHAIN = 2048


def chain(n: int, tag: str) -> list[bytes]:
    return [hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(n)]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("bench-redis")))
    server.start()
    yield server
    server.stop()


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds."""
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": ordered[-1] * 1000}


async def time_each(
    call: Callable[[], Awaitable[object]], rounds: int
) -> tuple[list[float], float]:
    """Await `call` `rounds` times after a warm-up: (wall seconds of each call, mean CPU seconds
    of this process per call). CPU time excludes waiting for a CPU on a busy machine (and, for
    Redis, the server's work), so it shows the cost that contention hides."""
    for _ in range(max(5, rounds // 20)):
        await call()
    out = []
    cpu_start = time.process_time()
    for _ in range(rounds):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)
    return out, (time.process_time() - cpu_start) / rounds


def report(title: str, numbers: dict[str, float]) -> None:
    shown = ", ".join(f"{k}={v:,.3f}" if v < 1000 else f"{k}={v:,.0f}" for k, v in numbers.items())
    print(f"\n{title}: {shown}")  # noqa: T201 - benchmarks print their numbers
