"""Child processes the harness owns: start, wait until an HTTP URL answers, stop for sure.

Each process writes stdout+stderr to a log file in the run's output folder (read it when a target
fails to start). ``stop`` sends SIGTERM to the process group, waits ``grace_s``, then SIGKILLs it,
so no simulator or router outlives a benchmark, even one interrupted with Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx


class StartError(RuntimeError):
    """A child process exited or never became ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ManagedProcess:
    """One child process started by the harness."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def wait_ready(
        self,
        urls: Sequence[str],
        timeout_s: float,
        ready: Callable[[httpx.Response], bool] | None = None,
    ) -> None:
        """Wait until every URL answers 200 and ``ready`` (if given) accepts the answer (or raise
        with the log's tail); an answer ``ready`` cannot parse (ValueError) is not ready."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = list(urls)
        async with httpx.AsyncClient(timeout=2.0) as client:
            while pending:
                if not self.running:
                    raise StartError(
                        f"{self.name} exited during start-up; log {self.log_path}:\n"
                        + log_tail(self.log_path)
                    )
                if loop.time() > deadline:
                    raise StartError(
                        f"{self.name} not ready after {timeout_s:g}s ({pending[0]}); "
                        f"log {self.log_path}:\n" + log_tail(self.log_path)
                    )
                try:
                    response = await client.get(pending[0])
                    if response.status_code == 200 and (ready is None or ready(response)):
                        pending.pop(0)
                        continue
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.2)

    async def stop(self, grace_s: float = 5.0) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
