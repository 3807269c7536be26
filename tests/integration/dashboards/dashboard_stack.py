"""A live kvgate stack for the dashboard test: sim fleet, router, indexer, Redis, Prometheus.

Every process is a real subprocess on free loopback ports with its log in the test's temporary
directory; `Stack.stop()` ends all of them (SIGTERM, then SIGKILL after a timeout). Prometheus
scrapes every second and attaches the target labels the chart's ServiceMonitors attach in a
cluster (`namespace`, `policy` on routers, `pool` = "<namespace>/<pool>" and `pod` on engines),
and the labels the Prometheus Operator puts on every target (`endpoint`, `service`,
`container`), so the dashboards' queries run here exactly as they run in Grafana.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

HOST = "127.0.0.1"
NAMESPACE = "kvgate-test"
POLICY = "dash"
POOL = "sim"
POOL_KEY = f"{NAMESPACE}/{POOL}"
MODEL = "m"
SIM_FLAGS = [
    "--model", MODEL, "--enable-prompt-tokens-details", "--block-size", "16",
    "--max-model-len", "1000", "--max-num-seqs", "2", "--num-gpu-blocks-override", "64",
]  # fmt: skip
_START_TIMEOUT_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    def __init__(
        self, name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None
    ):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=workdir, start_new_session=True,
        )  # fmt: skip

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def wait_http(self, url: str, timeout: float = _START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited during start-up:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} not ready at {url}:\n{self.log_tail()}")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def kvgate(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvgate.cli", "--log-level", "WARNING", *args]


class Stack:
    """Start with `start(redis_url)`; `router_url`, `prometheus_url`, `fleet_urls` then work."""

    def __init__(self, workdir: Path, pods: int = 3) -> None:
        self.workdir = workdir
        self.pods = pods
        self.processes: list[Process] = []
        self.fleet_urls: list[str] = []
        self.victim: Process | None = None
        self.victim_url = ""
        self.router_url = ""
        self.indexer_url = ""
        self.prometheus_url = ""

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, argv, self.workdir, env)
        self.processes.append(process)
        return process

    def start(self, redis_url: str) -> None:
        sim_env = {"PYTHONHASHSEED": "0"}  # the router hashes with hash_seed "0"
        ports = [(free_port(), free_port(), free_port()) for _ in range(self.pods)]
        fleet = []
        for i, (http, events, replay) in enumerate(ports):
            # `tcp://*:` binds, as vLLM does; the indexer connects to 127.0.0.1.
            kv_events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{events}",
                "replay_endpoint": f"tcp://*:{replay}",
                "topic": f"kv@{HOST}@{MODEL}",
            }
            fleet.append(self._start(f"pod-{i}", kvgate(
                "sim", "serve", "--host", HOST, "--port", str(http), f"--seed={i}",
                "--kv-events-config", json.dumps(kv_events), "--sim-time-scale", "0.3", *SIM_FLAGS,
            ), sim_env))  # fmt: skip
        self.fleet_urls = [f"http://{HOST}:{http}" for http, _, _ in ports]
        # A slow pod without KV events, killed under load: upstream errors and retries.
        victim_port = free_port()
        self.victim = self._start("victim", kvgate(
            "sim", "serve", "--host", HOST, "--port", str(victim_port), "--sim-time-scale", "3",
            *SIM_FLAGS,
        ), sim_env)  # fmt: skip
        self.victim_url = f"http://{HOST}:{victim_port}"
        static = [
            {"url": f"http://{HOST}:{http}", "kv_events": f"tcp://{HOST}:{events}",
             "kv_replay": f"tcp://{HOST}:{replay}"}
            for http, events, replay in ports
        ]  # fmt: skip
        pool = {
            "name": POOL,
            "namespace": NAMESPACE,
            "model": MODEL,
            "engine": {"block_size": 16, "hash_seed": "0"},
            "endpoints": {"static": [*static, {"url": self.victim_url}]},
        }
        # A loaded CI machine can take longer than the router's default 50 ms to answer.
        directory = {"backend": "redis", "redis": {"url": redis_url, "socket_timeout_seconds": 1.0}}
        router_port, indexer_port = free_port(), free_port()
        router_config = {
            "server": {"host": HOST, "port": router_port},
            "pools": [pool],
            "directory": {**directory, "embedded_indexer": False},
            "policy": {"name": "kvgate", "seed": 1},
        }
        indexer_config = {
            "pools": [{**pool, "endpoints": {"static": static}}],
            "directory": directory,
        }
        (self.workdir / "router.yaml").write_text(yaml.safe_dump(router_config))
        (self.workdir / "indexer.yaml").write_text(yaml.safe_dump(indexer_config))
        for pod, url in zip(fleet, self.fleet_urls, strict=True):
            pod.wait_http(url + "/health")
        self.victim.wait_http(self.victim_url + "/health")
        indexer = self._start("indexer", kvgate(
            "indexer", "--config", "indexer.yaml", "--host", HOST, "--port", str(indexer_port)))  # fmt: skip
        router = self._start("router", kvgate("router", "--config", "router.yaml"))
        self.indexer_url = f"http://{HOST}:{indexer_port}"
        self.router_url = f"http://{HOST}:{router_port}"
        indexer.wait_http(self.indexer_url + "/health")
        router.wait_http(self.router_url + "/health")
        self._start_prometheus(router_port, indexer_port, [http for http, _, _ in ports])

    def _start_prometheus(self, router_port: int, indexer_port: int, pods: list[int]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed (apt-get install prometheus)")

        def job(name: str, targets: list[tuple[int, dict[str, str]]]) -> dict[str, Any]:
            return {
                "job_name": name,
                # The Prometheus Operator's own target labels too (`endpoint`: the port's name,
                # `service`, `container`): a metric label of one of those names is renamed
                # `exported_<name>` on ingest, so a query by it would return one series.
                "static_configs": [
                    {
                        "targets": [f"{HOST}:{port}"],
                        "labels": {
                            "namespace": NAMESPACE,
                            "endpoint": "http",
                            "service": name,
                            "container": name,
                            **labels,
                        },
                    }
                    for port, labels in targets
                ],
            }

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                       "evaluation_interval": "1s"},
            "scrape_configs": [
                job("routers", [(router_port, {"policy": POLICY, "component": "router"})]),
                job("indexer", [(indexer_port, {"component": "indexer"})]),
                # The victim is not scraped: the engine counters are the fleet's, read directly too.
                job("engines", [(port, {"pool": POOL_KEY, "pod": f"{POOL}-{i}"})
                                for i, port in enumerate(pods)]),
            ],
        }  # fmt: skip
        (self.workdir / "prometheus.yml").write_text(json.dumps(config))
        port = free_port()
        self.prometheus_url = f"http://{HOST}:{port}"
        prometheus = self._start("prometheus", [
            binary, "--config.file=prometheus.yml", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address={HOST}:{port}", "--log.level=warn",
        ])  # fmt: skip
        prometheus.wait_http(self.prometheus_url + "/-/ready")
        # Prometheus applies discovered targets after up to ~5 s: scrape all before any load,
        # so every counter's first sample precedes its increase.
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while not self._all_targets_up(2 + self.pods):
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not scrape every target:\n{prometheus.log_tail()}")
            time.sleep(0.2)

    def _all_targets_up(self, count: int) -> bool:
        response = httpx.get(self.prometheus_url + "/api/v1/targets", timeout=5)
        active = response.json()["data"]["activeTargets"]
        return len(active) == count and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
