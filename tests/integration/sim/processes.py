"""A real `kvgate sim serve` / `kvgate sim fleet` process for integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

_START_TIMEOUT_SECONDS = 20.0


class SimProcess:
    def __init__(self, args: list[str], ports: list[int], log_path: Path) -> None:
        self.args = args
        self.ports = ports
        self.log_path = log_path
        env = {**os.environ, "PYTHONHASHSEED": os.environ.get("SIM_TEST_HASH_SEED", "0")}
        self._log = log_path.open("wb")
        self._client: httpx.Client | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvgate.cli", "sim", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    @property
    def client(self) -> httpx.Client:
        """A keep-alive client for pod 0 (a new connection per request is slow on a busy CI)."""
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, timeout=30)
        return self._client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        pending = list(self.urls())
        while pending:
            if self.proc.poll() is not None:
                pytest.fail(f"simulator exited: {self.log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"simulator did not start: {self.log_path.read_text()}")
            try:
                if httpx.get(pending[0] + "/health", timeout=1.0).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.TransportError:
                pass
            time.sleep(0.05)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
                    pytest.fail("the simulator did not stop within 10 s of SIGTERM")
                assert self.proc.returncode == 0, self.log_path.read_text()
        finally:
            self._log.close()  # also when the checks fail: a leaked file fails a later test


SimFactory = Callable[..., SimProcess]
