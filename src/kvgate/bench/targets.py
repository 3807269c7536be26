"""Targets: the routers a benchmark compares, each started and stopped by the harness.

| target name          | what runs                                                           |
|----------------------|---------------------------------------------------------------------|
| a kvgate policy      | ``kvgate router --policy NAME``: every policy of the scoring        |
|                      | registry (``round-robin``, ``least-load``, ``prefix``, ``kvgate``…)  |
| sglang-cache-aware   | ``sglang-router launch --policy cache_aware`` (PyPI ``sglang-router``) |
| sglang-round-robin   | ``sglang-router launch --policy round_robin``                       |

Every target is a child process on a free loopback port in front of the same simulated fleet's
pods; the harness waits for its health endpoint (the SGLang router's: until ``/workers`` lists
every pod healthy), runs the workload, and stops it. The SGLang router is looked for next to the
running Python (``.venv/bin/sglang-router``) and then on ``PATH``; if it is not installed the
target fails with an explanation (``pip install sglang-router``, the ``peers`` extra) rather than
being silently skipped.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.bench.processes import ManagedProcess, StartError, free_port
from kvgate.scoring.registry import default_registry

SGLANG_POLICIES = {
    "sglang-cache-aware": "cache_aware",
    "sglang-round-robin": "round_robin",
}
HOST = "127.0.0.1"


def kvgate_policies() -> list[str]:
    """Every policy of kvgate's scoring registry that runs with its default parameters
    (``pipeline`` needs a list of plugins), by the name ``--policy`` takes."""
    return [name for name in default_registry().names("policy") if name != "pipeline"]


def target_names() -> list[str]:
    return [*kvgate_policies(), *SGLANG_POLICIES]


class UnknownTargetError(ValueError):
    pass


def validate_targets(names: list[str]) -> list[str]:
    known = target_names()
    for name in names:
        if name not in known:
            raise UnknownTargetError(f"unknown target {name!r}; choose from {', '.join(known)}")
    return names


def kvgate_command() -> list[str]:
    """How to run ``kvgate`` as a child: this interpreter, so a venv need not be activated."""
    return [sys.executable, "-m", "kvgate.cli"]


def sglang_router_binary() -> str | None:
    beside = Path(sys.executable).with_name("sglang-router")
    if beside.exists():
        return str(beside)
    return shutil.which("sglang-router")


@dataclass
class RunningTarget:
    name: str
    base_url: str
    process: ManagedProcess

    async def stop(self) -> None:
        await self.process.stop()


def router_argv(
    name: str,
    pod_urls: list[str],
    model: str,
    port: int,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The command line that runs target ``name`` on ``port`` in front of ``pod_urls``."""
    if name in kvgate_policies():
        argv = [*kvgate_command(), "--log-level", "WARNING", "router"]
        for url in pod_urls:
            argv += ["--endpoint", url]
        argv += ["--model", model, "--policy", name]
        argv += ["--host", HOST, "--port", str(port)]
        return argv + list(extra_args or [])
    if name in SGLANG_POLICIES:
        binary = sglang_router_binary()
        if binary is None:
            raise StartError(
                f"target {name} needs the SGLang router: `.venv/bin/pip install sglang-router` "
                "(the `peers` extra of kvgate)"
            )
        return [
            binary,
            "launch",
            "--host",
            HOST,
            "--port",
            str(port),
            "--policy",
            SGLANG_POLICIES[name],
            "--worker-urls",
            *pod_urls,
            "--log-level",
            "warn",
            "--disable-retries",
            # its metrics listener defaults to 0.0.0.0:29000: one left running fails the next
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(free_port(HOST)),
            *(extra_args or []),
        ]
    raise UnknownTargetError(name)


def health_url(name: str, base_url: str) -> str:
    """Where a target says it can serve. The SGLang router registers its workers in the
    background after it starts listening: `/liveness` answers at once, and a request sent then
    gets 503 `no_available_workers`; `/readiness` answers 200 only once a worker is healthy."""
    return base_url + ("/readiness" if name in SGLANG_POLICIES else "/health")


async def start_target(
    name: str,
    pod_urls: list[str],
    model: str,
    log_dir: Path,
    *,
    startup_timeout_s: float = 60.0,
    extra_args: list[str] | None = None,
) -> RunningTarget:
    port = free_port(HOST)
    argv = router_argv(name, pod_urls, model, port, extra_args)
    target = await _start(name, argv, port, health_url(name, ""), log_dir, startup_timeout_s)
    if name in SGLANG_POLICIES:
        try:
            await target.process.wait_ready(
                [target.base_url + "/workers"],
                startup_timeout_s,
                lambda response: sglang_workers_ready(response.json(), pod_urls),
            )
        except BaseException:
            await target.process.stop()
            raise
    return target


def sglang_workers_ready(workers: Any, pod_urls: list[str]) -> bool:
    """Whether the SGLang router's ``GET /workers`` answer lists every pod as healthy. Its
    ``/readiness`` turns 200 once one worker is; the rest register in the background, and a
    benchmark started then would route everything to the first."""
    listed = workers.get("workers") if isinstance(workers, dict) else None
    if not isinstance(listed, list):
        return False
    healthy = {w.get("url") for w in listed if isinstance(w, dict) and w.get("is_healthy") is True}
    return all(url in healthy for url in pod_urls)


async def start_config_router(
    name: str, config_path: Path, log_dir: Path, *, startup_timeout_s: float = 60.0
) -> RunningTarget:
    """``kvgate router --config FILE`` on a free loopback port (overriding the file's
    ``server``), for benchmarks that need sections the quick-start flags do not set (tenants,
    flow control)."""
    port = free_port(HOST)
    argv = [*kvgate_command(), "--log-level", "WARNING", "router", "--config", str(config_path)]
    argv += ["--host", HOST, "--port", str(port)]
    return await _start(name, argv, port, "/health", log_dir, startup_timeout_s)


async def _start(
    name: str, argv: list[str], port: int, health_path: str, log_dir: Path, timeout_s: float
) -> RunningTarget:
    process = ManagedProcess(name, argv, log_dir / f"{name}.log")
    await process.start()
    base_url = f"http://{HOST}:{port}"
    try:
        await process.wait_ready([base_url + health_path], timeout_s)
    except BaseException:
        await process.stop()
        raise
    return RunningTarget(name=name, base_url=base_url, process=process)
