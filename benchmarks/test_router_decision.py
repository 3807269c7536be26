"""Router decision latency: classify + tokenize (chat template) + hash + directory lookup + score.

    .venv/bin/python -m pytest benchmarks/test_router_decision.py --benchmark-only -q -s

16 pods with fresh load, the repository's test tokenizer and chat template (exact keys), the
default `kvgate` policy; each sample is one `Router.plan(...)` of a request body, timed with
perf_counter over `SAMPLES` requests (p50/p99 printed). Cases:

- `2k`: a 2k-token prompt whose 1.5k-token system prompt one pod holds;
- `32k-agent`: a ~32k-token agent turn whose earlier messages were seen (and are held by one pod);
  every sample adds a new final message, as a real next turn does;
- `32k-agent-no-reuse`: `32k-agent` without the keyer's prompt reuse (`kvgate.router.core.reuse`),
  i.e. with only the tokenizer's segment cache and the hasher's span cache: what reuse saves;
- `32k-cold`: a ~32k-token prompt never seen before (nothing cached anywhere);
- `32k-agent-redis`: `32k-agent` with the directory in a real redis-server (the Redis cost).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tests.integration.conftest import RedisServer

from kvgate.api.router_config import RouterConfig
from kvgate.directory.factory import create_pool_index
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec, LoadSample
from kvgate.router.core.routing import Router
from kvgate.router.runtime import build_state

PODS = 16
SAMPLES = 300
TOKENIZER = Path(__file__).parents[1] / "tests" / "data" / "prefix" / "tokenizer"
WORDS = [
    "the",
    "router",
    "sends",
    "each",
    "request",
    "to",
    "the",
    "pod",
    "whose",
    "cache",
    "holds",
    "the",
    "longest",
    "prefix",
    "of",
    "its",
    "prompt",
    "unless",
    "waiting",
    "there",
    "costs",
    "more",
    "than",
    "computing",
    "it",
    "again",
    "on",
    "another",
    "pod",
    "while",
    "the",
    "agent",
    "reads",
    "files",
    "runs",
    "tests",
    "edits",
    "code",
    "and",
    "reports",
    "what",
    "it",
    "found",
]


def _text(rng: random.Random, tokens: int) -> str:
    # About 1.6 tokens per word with the test tokenizer.
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.6)))


def _config(backend: str, redis_url: str | None) -> RouterConfig:
    directory: dict[str, Any] = {"backend": backend}
    if redis_url:
        directory["redis"] = {"url": redis_url, "socket_timeout_seconds": 1.0}
    return RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "llama",
                    "model": "m",
                    "engine": {"tokenizer": {"path": str(TOKENIZER)}},
                    "endpoints": {
                        "static": [{"url": f"http://10.0.0.{i}:8000"} for i in range(PODS)]
                    },
                }
            ],
            "directory": directory,
            "policy": {"seed": 0},
            # Key every prompt on this thread, so that its CPU time is all in the samples
            # (the router itself keys prompts over 64 Ki characters in a worker thread).
            "keying": {"inline_max_chars": 1 << 30},
        }
    )


async def _router(backend: str, redis_url: str | None = None) -> Router:
    config = _config(backend, redis_url)
    endpoints = EndpointSet()
    pool = config.pools[0]
    await endpoints.replace_pool(
        pool.key,
        [
            EndpointSpec(id=f"pod-{i}", pool=pool.key, url=f"http://10.0.0.{i}:8000")
            for i in range(PODS)
        ],
    )
    rng = random.Random(1)
    for ep in endpoints.all():
        ep.load = LoadSample(rng.randint(0, 3), rng.randint(0, 30), rng.random(), 1e18)
        ep.inflight = rng.randint(0, 20)
    index = create_pool_index(config.directory, pool.key, DirectoryMetrics(CollectorRegistry()))
    return Router(build_state(config), endpoints, {pool.key: index}, clock=lambda: 1e18)


def _report(name: str, samples: list[tuple[float, float]]) -> dict[str, float]:
    """Wall-clock p50/p99 and CPU-time p50/p99 (thread CPU: immune to other processes)."""

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    wall = [w for w, _ in samples]
    cpu = [c for _, c in samples]
    result = {
        "p50_ms": pct(wall, 0.5),
        "p99_ms": pct(wall, 0.99),
        "cpu_p50_ms": pct(cpu, 0.5),
        "cpu_p99_ms": pct(cpu, 0.99),
    }
    shown = "  ".join(f"{k} {v:.3f}" for k, v in result.items())
    print(f"\n{name}: {shown}  (n={len(samples)})")  # noqa: T201
    return result


async def _hold(router: Router, body: dict[str, Any], pod: str) -> int:
    """Plan `body` once and record its blocks as held (exact) by `pod`; returns its tokens."""
    plan = await router.plan(body, {}, "chat")
    index = router.indexes[plan.pool.key]
    await index.add(pod, plan.keys.block_keys)
    return plan.keys.prompt_tokens


async def _case_2k(router: Router) -> list[tuple[float, float]]:
    rng = random.Random(2)
    system = {"role": "system", "content": _text(rng, 1500)}
    await _hold(router, {"model": "m", "messages": [system]}, "pod-3")
    samples = []
    for i in range(SAMPLES):
        body = {
            "model": "m",
            "messages": [system, {"role": "user", "content": f"{i} " + _text(rng, 500)}],
        }
        start, cpu = time.perf_counter(), time.thread_time()
        plan = await router.plan(body, {}, "chat")
        samples.append((time.perf_counter() - start, time.thread_time() - cpu))
    assert 1800 < plan.keys.prompt_tokens < 2400, plan.keys.prompt_tokens
    assert plan.decision.predicted_hit_tokens >= 1400
    return samples


async def _case_agent(router: Router) -> list[tuple[float, float]]:
    rng = random.Random(3)
    history: list[dict[str, str]] = [{"role": "system", "content": _text(rng, 2000)}]
    for _turn in range(20):  # 2k + 20 x 1.5k tokens
        history.append({"role": "user", "content": _text(rng, 300)})
        history.append({"role": "assistant", "content": _text(rng, 1200)})
    tokens = await _hold(router, {"model": "m", "messages": history}, "pod-7")
    samples = []
    for i in range(SAMPLES):
        body = {"model": "m", "messages": [*history, {"role": "user", "content": f"step {i}"}]}
        start, cpu = time.perf_counter(), time.thread_time()
        plan = await router.plan(body, {}, "chat")
        samples.append((time.perf_counter() - start, time.thread_time() - cpu))
    assert 28_000 < tokens < 40_000, tokens
    assert plan.decision.endpoint_id == "pod-7" and plan.decision.predicted_hit_tokens > 28_000
    return samples


async def _case_cold(router: Router) -> list[tuple[float, float]]:
    rng = random.Random(4)
    samples = []
    for i in range(max(30, SAMPLES // 10)):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"{i} " + _text(rng, 32_000)}],
        }
        start, cpu = time.perf_counter(), time.thread_time()
        plan = await router.plan(body, {}, "chat")
        samples.append((time.perf_counter() - start, time.thread_time() - cpu))
    assert plan.keys.prompt_tokens > 28_000 and plan.decision.predicted_hit_tokens == 0
    return samples


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("router-bench-redis")))
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("case", ["2k", "32k-agent", "32k-agent-no-reuse", "32k-cold"])
def test_decision_latency(benchmark: Any, case: str) -> None:
    run = {"2k": _case_2k, "32k-cold": _case_cold}.get(case, _case_agent)

    async def go() -> list[tuple[float, float]]:
        router = await _router("memory")
        if case == "32k-agent-no-reuse":
            for keyer in router.state.keyer_by_pool.values():
                keyer.reuse = None
        return await run(router)

    samples = benchmark.pedantic(lambda: asyncio.run(go()), rounds=1, iterations=1)
    benchmark.extra_info.update(_report(f"decision {case} (memory directory)", samples))


def test_decision_latency_redis(benchmark: Any, redis_server: RedisServer) -> None:
    async def go() -> list[tuple[float, float]]:
        router = await _router("redis", redis_server.url)
        try:
            return await _case_agent(router)
        finally:
            for index in router.indexes.values():
                await index.close()

    samples = benchmark.pedantic(lambda: asyncio.run(go()), rounds=1, iterations=1)
    benchmark.extra_info.update(_report("decision 32k-agent (redis directory)", samples))
