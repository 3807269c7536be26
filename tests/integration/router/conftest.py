"""Real simulated pods (one `kvgate sim serve` process each, so one can be killed) and the router
served by uvicorn on a free loopback port, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from tests.integration.conftest import free_port, free_port_range
from tests.integration.sim.processes import SimProcess

from kvgate.api.router_config import RouterConfig
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.app import RouterApp

# Fast simulated time; prompt-token details on, as the operator renders vLLM's flags.
SIM_FLAGS = ("--model", "m", "--enable-prompt-tokens-details", "--sim-time-scale", "0.2")


@pytest.fixture
def sim_pods(tmp_path: Path) -> Iterator[Callable[..., list[SimProcess]]]:
    """`sim_pods(n, *extra_flags)` starts n single-pod simulator processes (stopped at teardown)."""
    started: list[SimProcess] = []

    def start(n: int, *flags: str) -> list[SimProcess]:
        procs = []
        for _ in range(n):
            port = free_port()
            args = ["serve", "--port", str(port), "--host", "127.0.0.1", *SIM_FLAGS, *flags]
            proc = SimProcess(args, [port], tmp_path / f"pod-{len(started)}.log")
            started.append(proc)
            procs.append(proc)
        for proc in procs:
            proc.wait_ready()
        return procs

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def sim_fleet(tmp_path: Path) -> Iterator[Callable[..., tuple[SimProcess, int, int]]]:
    """`sim_fleet(n, *flags)`: one `kvgate sim fleet` process of n pods with KV events on
    loopback; returns (process, first events port, first replay port)."""
    started: list[SimProcess] = []

    def start(n: int, *flags: str) -> tuple[SimProcess, int, int]:
        base, events, replay = free_port_range(n, 3)
        args = ["fleet", "--pods", str(n), "--base-port", str(base), "--host", "127.0.0.1",
                "--kv-events-base-port", str(events), "--kv-replay-base-port", str(replay),
                *SIM_FLAGS, *flags]  # fmt: skip
        proc = SimProcess(
            args, [base + i for i in range(n)], tmp_path / f"fleet-{len(started)}.log"
        )
        started.append(proc)
        proc.wait_ready()
        return proc, events, replay

    yield start
    for proc in started:
        proc.stop()


def pool_config(urls: list[str], **overrides: Any) -> RouterConfig:
    data: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": free_port()},
        "pools": [{"name": "p", "model": "m", "endpoints": {"static": [{"url": u} for u in urls]}}],
        "policy": {"seed": 7},
    }
    data.update(overrides)
    return RouterConfig.model_validate(data)


@contextlib.asynccontextmanager
async def serve_router(config: RouterConfig) -> AsyncIterator[tuple[str, RouterRuntime]]:
    """The router on a real socket; yields (base URL, runtime)."""
    runtime = RouterRuntime(config)
    server = uvicorn.Server(
        uvicorn.Config(
            RouterApp(runtime),
            host=config.server.host,
            port=config.server.port,
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
    )
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "router did not start"
    try:
        yield f"http://{config.server.host}:{config.server.port}", runtime
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c
