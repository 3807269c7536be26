"""A real `kvgate router --config` process, small-request load and large prompts against it.

Shared by the large-prompt and memory tests (`test_router_large_prompts.py`) and the benchmark
(`benchmarks/large_prompts.py`): the router runs in its own process, so its event loop, its
RSS and its CPU are its own, as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.integration.conftest import free_port

TOKENIZER = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
WORDS = ["cache", "router", "prefix", "token", "block", "queue", "agent", "pod", "héllo", "漢字"]


class RouterProcess:
    """`kvgate router --config FILE` on a free loopback port; `stop()` sends SIGINT."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        config = {**config, "server": {"host": "127.0.0.1", "port": self.port}}
        path = workdir / f"router-{self.port}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"router-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvgate.cli", "router", "--config", str(path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, within_seconds: float = 30.0) -> None:
        deadline = time.monotonic() + within_seconds
        async with httpx.AsyncClient(base_url=self.url, timeout=2) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"router exited: {self.log()}")
                try:
                    if (await client.get("/ready")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"router not ready in {within_seconds} s: {self.log()}")

    def rss_bytes(self) -> int:
        """Resident set size of the router process (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def router_config(pod_urls: list[str], **engine: Any) -> dict[str, Any]:
    """One exact-mode pool (the test tokenizer) over `pod_urls`, routing history only."""
    return {
        "pools": [
            {
                "name": "p",
                "model": "m",
                "engine": {"kv_events": False, "tokenizer": {"path": TOKENIZER}, **engine},
                "endpoints": {"static": [{"url": u} for u in pod_urls]},
            }
        ],
        "policy": {"seed": 1},
    }


def text_of(chars: int, rng: random.Random) -> str:
    """About `chars` characters of varied words and numbers (about 3 characters a token)."""
    words = []
    total = 0
    while total < chars:
        word = rng.choice(WORDS) + str(rng.randint(0, 9999))
        words.append(word)
        total += len(word) + 1
    return " ".join(words)[:chars]


def large_chat_body(chars: int, seed: int, **extra: Any) -> bytes:
    """A chat body whose one message is a fresh text of `chars` characters."""
    rng = random.Random(seed)
    content = f"[{seed}] " + text_of(chars, rng)
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    return json.dumps({**body, **extra}, ensure_ascii=False).encode()


SMALL = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
).encode()


@dataclass
class Samples:
    """Latencies (seconds) of small requests, by the phase they started in."""

    by_phase: dict[str, list[float]] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (phase, status or exception)

    def add(self, phase: str, seconds: float) -> None:
        self.by_phase.setdefault(phase, []).append(seconds)

    def quantile(self, phase: str, q: float) -> float:
        values = sorted(self.by_phase.get(phase, []))
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]


async def small_load(
    url: str,
    samples: Samples,
    phase: list[str],
    stop: asyncio.Event,
    concurrency: int = 4,
    *,
    router_only: bool = False,
) -> None:
    """`concurrency` closed-loop clients sending a small chat request (`router_only`:
    `GET /v1/models`, answered by the router itself, so only its event loop is measured); each
    latency is filed under the phase current when the request started (`phase[0]`)."""
    headers = {"content-type": "application/json"}

    async def client_loop() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while not stop.is_set():
                started_in = phase[0]
                started = time.perf_counter()
                try:
                    if router_only:
                        response = await client.get("/v1/models")
                    else:
                        response = await client.post(
                            "/v1/chat/completions", content=SMALL, headers=headers
                        )
                except httpx.HTTPError as exc:
                    samples.errors.append((started_in, repr(exc)))
                    continue
                if response.status_code != 200:
                    samples.errors.append((started_in, f"{response.status_code} {response.text}"))
                    continue
                samples.add(started_in, time.perf_counter() - started)

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
