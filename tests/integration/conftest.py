"""Fixtures that start real servers on free loopback ports and stop them afterwards.

Redis: `redis_url` gives a test an empty database on a redis-server shared by the session
(started on first use, in a temporary directory, persistence off); `redis_server_factory` starts
dedicated servers a test may stop, restart or pause (e.g. to check behaviour while Redis is down).
Every test under tests/integration is marked `integration`.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_START_TIMEOUT_SECONDS = 10.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One `redis-server` process on 127.0.0.1, data in `workdir`, no persistence."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):  # the free port may be taken between probe and bind
            self.port = self.port or free_port()
            log = (self.workdir / "redis.log").open("ab")
            self._proc = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
                 str(self.workdir), "--save", "", "--appendonly", "no", "--daemonize", "no",
                 "--protected-mode", "no", "--logfile", ""],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip
            log.close()
            if self._wait_ready():
                return
            self.stop()
            self.port = 0
        pytest.fail(f"redis-server did not start; see {self.workdir / 'redis.log'}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def flushall(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"FLUSHALL\r\n")
            assert sock.recv(64).startswith(b"+OK")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing answers, as in a stall."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server shared by the session (prefer `redis_url`, which empties it first)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of an empty Redis database on a real redis-server (shared; emptied for each test)."""
    redis_server.flushall()
    return redis_server.url


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[Callable[[], RedisServer]]:
    """Start dedicated redis-servers (stop/start them at will); all are stopped at teardown."""
    servers: list[RedisServer] = []

    def start() -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}")
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()
