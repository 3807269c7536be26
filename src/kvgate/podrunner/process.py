"""One container as a supervised local process, with its readiness probe.

``ContainerProcess.run()`` starts the program, and while it lives probes readiness as the
container's ``readinessProbe`` says (``httpGet`` 2xx/3xx, ``tcpSocket`` connect; ``exec`` and
``grpc`` count as a TCP connect to the first port, or as ready). Until the first success it
probes every ``min(periodSeconds, 1)`` seconds so pods become Ready soon after they can serve;
then every ``periodSeconds``; ``failureThreshold`` consecutive failures make it unready again.
When the program exits it is restarted with exponential backoff (1 s doubling to 20 s), the
way ``restartPolicy: Always`` behaves; the restart count and the last exit code are kept for the
pod status. Every change of state calls ``on_change``. ``stop()`` sends SIGTERM to the process
group, waits up to the grace period, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kvgate.podrunner.spec import ProcessSpec

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 20.0


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    """What the pod status says about one container."""

    ready: bool = False
    running: bool = False
    restart_count: int = 0
    started_at: str = ""
    last_exit_code: int | None = None
    last_finished_at: str = ""
    waiting_reason: str = "ContainerCreating"


class ContainerProcess:
    """Runs, probes and restarts one container's program."""

    def __init__(
        self,
        spec: ProcessSpec,
        *,
        pod_ip: str,
        probe: Mapping[str, Any] | None,
        log_path: Path,
        on_change: Callable[[], None],
    ) -> None:
        self.spec = spec
        self.state = ContainerState()
        self._pod_ip = pod_ip
        self._probe = probe
        self._log_path = log_path
        self._on_change = on_change
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def run(self) -> None:
        """Supervise the program until ``stop()``; returns only then (or if cancelled)."""
        if not self.spec.argv:  # an image we do not run: report it running and ready
            self.state = ContainerState(ready=True, running=True, started_at=now_rfc3339())
            self._on_change()
            await asyncio.Event().wait()
        backoff = 1.0
        async with httpx.AsyncClient() as client:
            while not self._stopping:
                started = asyncio.get_running_loop().time()
                code = await self._run_once(client)
                if self._stopping:
                    return
                self.state.ready = False
                self.state.running = False
                self.state.last_exit_code = code
                self.state.last_finished_at = now_rfc3339()
                self.state.restart_count += 1
                self.state.waiting_reason = "CrashLoopBackOff" if code else "Completed"
                self._on_change()
                log.warning(
                    "%s exited with %s; restarting in %.0f s (log %s)",
                    self.spec.container,
                    code,
                    backoff,
                    self._log_path,
                )
                if asyncio.get_running_loop().time() - started > 60:
                    backoff = 1.0
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def _run_once(self, client: httpx.AsyncClient) -> int:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._log_path.open("ab") as log_file:
            log_file.write(f"--- {now_rfc3339()} starting: {self.spec.argv}\n".encode())
            log_file.flush()
            try:
                self._process = await asyncio.create_subprocess_exec(
                    *self.spec.argv,
                    env=dict(self.spec.env),
                    cwd=self.spec.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,
                )
            except OSError as exc:
                log_file.write(f"--- cannot start: {exc}\n".encode())
                return 127
        pid_file = self._log_path.with_suffix(".pid")  # for hack/cluster/down.sh
        pid_file.write_text(str(self._process.pid))
        self.state.running = True
        self.state.started_at = now_rfc3339()
        self.state.waiting_reason = ""
        self._on_change()
        probing = asyncio.create_task(self._probe_loop(client), name=f"probe-{self.spec.container}")
        try:
            return await self._process.wait()
        finally:
            pid_file.unlink(missing_ok=True)
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing

    async def _probe_loop(self, client: httpx.AsyncClient) -> None:
        probe = self._probe or {}
        period = float(probe.get("periodSeconds", 10))
        failure_threshold = int(probe.get("failureThreshold", 3))
        await asyncio.sleep(min(float(probe.get("initialDelaySeconds", 0)), 5.0))
        failures = 0
        while True:
            ok = await self.probe_once(client)
            if ok:
                failures = 0
                if not self.state.ready:
                    self.state.ready = True
                    self._on_change()
            else:
                failures += 1
                if self.state.ready and failures >= failure_threshold:
                    self.state.ready = False
                    self._on_change()
            await asyncio.sleep(period if self.state.ready else min(period, 1.0))

    async def probe_once(self, client: httpx.AsyncClient) -> bool:
        """One readiness check; no probe means ready as soon as the process runs."""
        probe = self._probe
        if not probe:
            return True
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                scheme = str(get.get("scheme", "HTTP")).lower()
                url = f"{scheme}://{self._pod_ip}:{self._port(get['port'])}{get.get('path', '/')}"
                response = await client.get(url, timeout=timeout)
                return 200 <= response.status_code < 400
            section = probe.get("tcpSocket") or probe.get("grpc")
            if section is None:
                return True  # exec probes: the process running is the best we know
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._pod_ip, self._port(section["port"])), timeout
            )
            writer.close()
            await writer.wait_closed()
            return True
        except (OSError, httpx.HTTPError, TimeoutError):
            return False

    def _port(self, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return self.spec.ports[str(port)]

    async def stop(self, grace_seconds: float) -> None:
        """SIGTERM the process group, SIGKILL after the grace period."""
        self._stopping = True
        process = self._process
        if process is None or process.returncode is not None:
            return
        self._signal(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            log.warning(
                "%s ignored SIGTERM for %.0f s; killing", self.spec.container, grace_seconds
            )
            self._signal(process.pid, signal.SIGKILL)
            await process.wait()

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
