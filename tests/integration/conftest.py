"""Fixtures that start real servers on free loopback ports and stop them afterwards.

Redis: `redis_url` gives a test an empty database on a redis-server shared by the session
(started on first use, in a temporary directory, persistence off); `redis_server_factory` starts
dedicated servers a test may stop, restart or pause (e.g. to check behaviour while Redis is down).
Redis Cluster (`redis_cluster.py`): `redis_cluster_url` names a node of an emptied three-master
cluster shared by the session; `redis_cluster_factory` starts dedicated clusters with replicas.
Every test under tests/integration is marked `integration`.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the module imports this one (RedisServer)
    from tests.integration.redis_cluster import RedisClusterNodes

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


def free_port_range(count: int, groups: int = 1) -> list[int]:
    """`groups` base ports whose ranges [base, base + count) are disjoint and free right now.

    The ranges lie below the kernel's ephemeral range, so no outgoing connection and no
    `free_port()` (which binds port 0) can take a port of them between this check and the
    process that binds it; only another explicit pick could, and the bind check catches it.
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = max(1024, ephemeral_low - 12_000)
    for _attempt in range(200):
        bases = [random.randrange(low, ephemeral_low - count) for _ in range(groups)]
        ports = [b + i for b in bases for i in range(count)]
        if len(set(ports)) != len(ports):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in ports:
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return bases
    raise RuntimeError("no free port ranges")


@dataclass(frozen=True)
class TlsFiles:
    """A CA and a server certificate for 127.0.0.1 / localhost it signed (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        """A client context that trusts only this CA."""
        return ssl.create_default_context(cafile=str(self.ca))


def make_tls_files(directory: Path, hosts: Sequence[str] = ("localhost",)) -> TlsFiles:
    """Make a throwaway CA and a server certificate for 127.0.0.1 and `hosts` with openssl
    (EC keys, valid 1 day)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    ca_key, csr, ext = directory / "ca.key", directory / "server.csr", directory / "server.ext"
    names = ",".join(["IP:127.0.0.1", *(f"DNS:{h}" for h in hosts)])
    ext.write_text(f"subjectAltName={names}\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(files.ca), "-days", "1",
        "-subj", "/CN=kvgate test CA")  # fmt: skip
    run("req", *ec, "-keyout", str(files.key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(files.cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return files


class RedisServer:
    """One `redis-server` process on 127.0.0.1, data in `workdir`, no persistence.

    With `tls`, it listens only on a TLS port (no client certificates required); `extra_args`
    go to redis-server as given (e.g. cluster mode, with a `{bus_port}` placeholder for a second
    free port).
    """

    def __init__(
        self, workdir: Path, *, tls: TlsFiles | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self.workdir = workdir
        self.tls = tls
        self.extra_args = list(extra_args)
        self.port = 0
        self.bus_port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no"]  # fmt: skip

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):  # the free port may be taken between probe and bind
            self.port = self.port or free_port()
            self.bus_port = self.bus_port or free_port()
            extra = [a.replace("{bus_port}", str(self.bus_port)) for a in self.extra_args]
            log = (self.workdir / "redis.log").open("ab")
            self._proc = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", *self._listen_args(), "--dir",
                 str(self.workdir), "--save", "", "--appendonly", "no", "--daemonize", "no",
                 "--protected-mode", "no", "--logfile", "", *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip
            log.close()
            if self._wait_ready():
                return
            self.stop()
            self.port = self.bus_port = 0
        pytest.fail(f"redis-server did not start; see {self.workdir / 'redis.log'}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self, *words: str, timeout: float = 5.0) -> bytes:
        """Send one inline command and return the start of the reply (TLS when configured)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as raw:
            if self.tls is None:
                raw.sendall(" ".join(words).encode() + b"\r\n")
                return raw.recv(4096)
            with self.tls.context().wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(" ".join(words).encode() + b"\r\n")
                return sock.recv(4096)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                if self.command("PING", timeout=0.5).startswith((b"+PONG", b"-NOAUTH")):
                    return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def flushall(self) -> None:
        assert self.command("FLUSHALL").startswith(b"+OK")

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, as when its node dies."""
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait(timeout=5)
        self._proc = None

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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """Three masters without replicas, shared by the session (prefer `redis_cluster_url`)."""
    from tests.integration.redis_cluster import RedisClusterNodes

    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterNodes) -> str:
    """URL of one node of an emptied three-master Redis Cluster."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def redis_cluster_factory(tmp_path: Path) -> Iterator[Callable[[int], RedisClusterNodes]]:
    """Start dedicated clusters (`replicas` per master) a test may break; stopped at teardown."""
    from tests.integration.redis_cluster import RedisClusterNodes

    clusters: list[RedisClusterNodes] = []

    def start(replicas: int) -> RedisClusterNodes:
        cluster = RedisClusterNodes(tmp_path / f"cluster-{len(clusters)}", replicas=replicas)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()
