"""Start real `kvgate sim serve` / `kvgate sim fleet` processes on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.conftest import free_port, free_port_range
from tests.integration.sim.processes import SimFactory, SimProcess


@pytest.fixture(scope="module")
def start_sim_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFactory]:
    """Like :func:`start_sim`, for processes shared by a test module."""
    yield from _factory(tmp_path_factory.mktemp("sim"))


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[SimFactory]:
    yield from _factory(tmp_path)


def _factory(tmp_path: Path) -> Iterator[SimFactory]:
    """``start_sim(*flags, pods=None)``: a pod (``serve``) or a fleet of ``pods`` pods."""
    started: list[SimProcess] = []

    def start(*flags: str, pods: int | None = None) -> SimProcess:
        if pods is None:
            ports = [free_port()]
            args = ["serve", "--port", str(ports[0]), "--host", "127.0.0.1", *flags]
        else:
            [base] = free_port_range(pods)
            ports = [base + i for i in range(pods)]
            args = ["fleet", "--pods", str(pods), "--base-port", str(base), *flags]
        proc = SimProcess(args, ports, tmp_path / f"sim-{len(started)}.log")
        started.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()
