"""A real Redis Cluster for tests: `redis-server --cluster-enabled yes` processes on free loopback
ports, joined with `redis-cli --cluster create` (three masters, each with `replicas` replicas).

Nodes time out after `NODE_TIMEOUT_MS`, so a killed master's replica is promoted within a few
seconds; `--cluster-replica-validity-factor 0` lets a replica take over however long ago it last
heard from its master (a loaded test machine must not block the failover).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tests.integration.conftest import RedisServer, TlsFiles

NODE_TIMEOUT_MS = 1000
_READY_TIMEOUT_SECONDS = 60.0


class RedisClusterNodes:
    """Three masters (`replicas` replicas each) forming one cluster; `url` names the first."""

    def __init__(
        self, workdir: Path, *, replicas: int = 0, masters: int = 3, tls: TlsFiles | None = None
    ) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--cluster-port", "{bus_port}",
                "--cluster-replica-validity-factor", "0"]  # fmt: skip
        if tls is not None:  # clients, the cluster bus and replication all over TLS
            args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        self.replicas = replicas
        self.tls = tls
        self.nodes = [
            RedisServer(workdir / f"node-{i}", tls=tls, extra_args=args)
            for i in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.fail("redis-cli is not installed (apt-get install redis-tools)")
        for node in self.nodes:
            node.start()
        tls = ["--tls", "--cacert", str(self.tls.ca)] if self.tls else []
        subprocess.run(
            [cli, *tls, "--cluster", "create", *(n.address for n in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.wait_healthy()

    def live_nodes(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.running]

    def wait_healthy(self, timeout: float = _READY_TIMEOUT_SECONDS) -> None:
        """Until every live node says the cluster is ok and covers all 16384 slots."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                infos = [n.command("CLUSTER", "INFO") for n in self.live_nodes()]
            except OSError:
                infos = []
            if infos and all(
                b"cluster_state:ok" in i and b"cluster_slots_ok:16384" in i for i in infos
            ):
                return
            time.sleep(0.1)
        pytest.fail("the Redis Cluster did not become healthy")

    def masters(self) -> list[RedisServer]:
        return [n for n in self.live_nodes() if b"role:master" in n.command("INFO", "replication")]

    def node_at(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def flushall(self) -> None:
        for node in self.masters():
            node.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
