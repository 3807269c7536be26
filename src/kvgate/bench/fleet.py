"""The simulated fleet under test, and a sampler of each pod's load.

The fleet runs in child processes, so the simulated engines' clocks never compete with the load
generator's event loop: by default one ``kvgate sim serve --enable-prompt-tokens-details`` per pod
on free loopback ports (like one vLLM per pod, free to use every core), or one ``kvgate sim
fleet`` for all pods on consecutive ports. Between targets the harness either restarts it (``fresh``) or empties
every pod's prefix cache with ``POST /reset_prefix_cache`` (what vLLM offers, and quicker).

KV events: a pod started alone follows vLLM's rule and *binds* its publisher only to a wildcard or
``ipc://`` endpoint (it *connects* to any other, and then the router's subscriber, which connects
too, hears nothing). Per-pod, each pod therefore publishes on its own ``ipc://`` socket in a
private temporary folder: bound, as in a real pod, and off the network. ``kvgate sim fleet``
binds its ``tcp://`` loopback ports itself.

:class:`PodLoadSampler` polls each pod's ``/metrics`` every ``interval_s`` and keeps
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``: the per-pod load plot is drawn
from the pods' own numbers, for every target alike (the SGLang router does not say which pod it
chose).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import httpx

from kvgate.bench.processes import ManagedProcess, StartError, free_port, free_ports
from kvgate.bench.records import LoadSample
from kvgate.bench.targets import HOST, kvgate_command
from kvgate.promtext import parse_samples, sum_samples

ENGINE_COUNTERS = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
)


def sum_metrics(
    metrics_text: str, names: tuple[str, ...], where: Mapping[str, str] | None = None
) -> dict[str, float]:
    """Each named series of a Prometheus text page, summed over its label sets (0 if absent);
    `where`: only the samples carrying these label values."""
    return {**dict.fromkeys(names, 0.0), **sum_samples(metrics_text, names, where)}


async def scrape_sums(
    client: httpx.AsyncClient, urls: list[str], names: tuple[str, ...]
) -> dict[str, float]:
    """:func:`sum_metrics` over several servers' /metrics (unreachable ones count as 0)."""

    async def one(url: str) -> dict[str, float]:
        try:
            response = await client.get(url + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            return dict.fromkeys(names, 0.0)
        return sum_metrics(response.text, names)

    total = dict.fromkeys(names, 0.0)
    for part in await asyncio.gather(*(one(u) for u in urls)):
        for name, value in part.items():
            total[name] += value
    return total


def mean_from_delta(
    before: dict[str, float], after: dict[str, float], histogram: str, scale: float = 1.0
) -> float | None:
    """Mean of a histogram over the interval between two scrapes (None if nothing observed)."""
    count = after[histogram + "_count"] - before[histogram + "_count"]
    if count <= 0:
        return None
    return (after[histogram + "_sum"] - before[histogram + "_sum"]) / count / scale


def parse_load(metrics_text: str) -> tuple[float, float]:
    """(running, waiting) from a vLLM /metrics page (summed over label sets)."""
    sums = sum_metrics(metrics_text, ("vllm:num_requests_running", "vllm:num_requests_waiting"))
    return sums["vllm:num_requests_running"], sums["vllm:num_requests_waiting"]


def parse_num_gpu_blocks(metrics_text: str) -> int | None:
    """``num_gpu_blocks`` from a vLLM /metrics page (the ``vllm:cache_config_info`` labels)."""
    for sample in parse_samples(metrics_text):
        blocks = sample.labels.get("num_gpu_blocks")
        if sample.name == "vllm:cache_config_info" and blocks is not None and blocks.isdigit():
            return int(blocks)
    return None


async def scrape_kv_capacity_blocks(client: httpx.AsyncClient, urls: list[str]) -> int | None:
    """Blocks the whole fleet can cache: the sum over pods of ``num_gpu_blocks - 1`` (block 0
    is vLLM's null block). None when a pod does not answer or does not say."""

    async def one(url: str) -> int | None:
        try:
            response = await client.get(url + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        return parse_num_gpu_blocks(response.text)

    blocks = await asyncio.gather(*(one(u) for u in urls))
    if not blocks or any(b is None for b in blocks):
        return None
    return sum(max(0, b - 1) for b in blocks if b is not None)


class SimFleet:
    """Simulated pods as child processes: one ``kvgate sim serve`` per pod (``per_pod``, like
    one vLLM per pod, and free to use every core) or one ``kvgate sim fleet`` for all."""

    def __init__(
        self,
        pods: int,
        model: str,
        log_dir: Path,
        *,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
        kv_events: bool = False,
        per_pod: bool = True,
    ) -> None:
        self.pods = pods
        self.kv_events = kv_events
        self.model = model
        self.per_pod = per_pod
        self._log_dir = log_dir
        self._extra_args = list(extra_args or [])
        self._startup_timeout_s = startup_timeout_s
        self._processes: list[ManagedProcess] = []
        self.urls: list[str] = []
        self.kv_event_sockets: list[str] = []  # the router's ZMQ endpoint per pod, when kv_events
        self._socket_dir: Path | None = None  # per-pod ipc:// sockets live here

    def _common(self) -> list[str]:
        return ["--model", self.model, "--enable-prompt-tokens-details", *self._extra_args]

    def _fleet_argv(self, base_port: int, events_port: int | None) -> list[str]:
        events = [] if events_port is None else ["--kv-events-base-port", str(events_port)]
        return [
            *kvgate_command(),
            "--log-level",
            "WARNING",
            "sim",
            "fleet",
            "--pods",
            str(self.pods),
            "--host",
            HOST,
            "--base-port",
            str(base_port),
            *events,
            *self._common(),
        ]

    def _pod_argv(self, index: int, port: int, events: str | None) -> list[str]:
        argv = [*kvgate_command(), "--log-level", "WARNING", "sim", "serve"]
        argv += ["--host", HOST, "--port", str(port), f"--seed={index}"]
        if events is not None:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": events,  # ipc:// is bound by vLLM's rule (tcp://HOST:PORT would not be)
                "topic": f"kv@{HOST}@{self.model}",  # what the router derives
            }
            argv += ["--kv-events-config", json.dumps(config)]
        return argv + self._common()

    async def start(self) -> None:
        if self.per_pod:
            await self._start_per_pod()
            return
        for _attempt in range(3):
            base_port = free_port(HOST)
            self.urls = [f"http://{HOST}:{base_port + i}" for i in range(self.pods)]
            events_port = free_port(HOST) if self.kv_events else None
            if events_port is not None:
                self.kv_event_sockets = [
                    f"tcp://{HOST}:{events_port + i}" for i in range(self.pods)
                ]
            argv = self._fleet_argv(base_port, events_port)
            process = ManagedProcess("sim-fleet", argv, self._log_dir / "fleet.log")
            await process.start()
            try:
                await process.wait_ready(
                    [u + "/health" for u in self.urls], self._startup_timeout_s
                )
            except StartError:
                await process.stop()
                if "address already in use" in _read(self._log_dir / "fleet.log").lower():
                    continue  # a port after base_port was taken; try another range
                raise
            self._processes = [process]
            return
        raise StartError("could not find free consecutive ports for the fleet")

    async def _start_per_pod(self) -> None:
        http_ports = free_ports(self.pods, HOST)
        self.urls = [f"http://{HOST}:{p}" for p in http_ports]
        events: list[str | None] = [None] * self.pods
        if self.kv_events:
            # A short path: ipc:// paths are limited to about 100 bytes.
            self._socket_dir = Path(tempfile.mkdtemp(prefix="kvgate-ev-"))
            events = [f"ipc://{self._socket_dir}/pod-{i}" for i in range(self.pods)]
        self.kv_event_sockets = [e for e in events if e is not None]
        self._processes = [
            ManagedProcess(
                f"sim-pod-{i}",
                self._pod_argv(i, port, events[i]),
                self._log_dir / f"pod-{i}.log",
            )
            for i, port in enumerate(http_ports)
        ]
        try:
            for process in self._processes:
                await process.start()
            for process, url in zip(self._processes, self.urls, strict=True):
                await process.wait_ready([url + "/health"], self._startup_timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        processes, self._processes = self._processes, []
        await asyncio.gather(*(p.stop() for p in processes))
        socket_dir, self._socket_dir = self._socket_dir, None
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def reset_prefix_caches(self, client: httpx.AsyncClient) -> None:
        """Empty every pod's prefix cache (each target starts cold, like a fresh fleet)."""
        responses = await asyncio.gather(
            *(client.post(u + "/reset_prefix_cache", timeout=10.0) for u in self.urls)
        )
        for url, response in zip(self.urls, responses, strict=True):
            if response.status_code != 200:
                raise StartError(f"{url}/reset_prefix_cache answered {response.status_code}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class PodLoadSampler:
    """Polls each pod's /metrics while a target runs; owned task, stopped with :meth:`stop`."""

    def __init__(self, client: httpx.AsyncClient, urls: list[str], interval_s: float = 1.0) -> None:
        self._client = client
        self._urls = urls
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.samples: list[LoadSample] = []

    def start(self) -> None:
        self._t0 = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._run(), name="pod-load-sampler")

    async def stop(self) -> list[LoadSample]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        return self.samples

    async def _sample(self, url: str) -> None:
        try:
            response = await self._client.get(url + "/metrics", timeout=2.0)
        except httpx.HTTPError:
            return
        running, waiting = parse_load(response.text)
        t = asyncio.get_running_loop().time() - self._t0
        self.samples.append(
            LoadSample(t_s=t, pod=url.split("//", 1)[-1], running=running, waiting=waiting)
        )

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._sample(u) for u in self._urls))
            await asyncio.sleep(self._interval_s)
