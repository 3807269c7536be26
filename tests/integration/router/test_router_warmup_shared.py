"""Router replicas share the warm-up of a pod that joins through a real Redis: one set of warm
requests, the other replica follows it; with Redis down each warms the pod on its own.

Two router runtimes in this process (each with its own core, warmer and Redis tasks, as two
router pods have), one real redis-server, and fake pods behind `httpx.MockTransport` that
record every request and can hold the new pod's warm requests, so the warm-up can be watched.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from tests.unit.router.fakes import FakePods, make_config

from kvgate.discovery.endpoints import EndpointSpec
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.app import RouterApp

pytestmark = [pytest.mark.timeout(120)]

POOL = "default/p"
NEW = "pod2:8000"
SYSTEMS = [list(range(1000, 1512)), list(range(5000, 5512))]  # 32 blocks each


class HeldPods(FakePods):
    """Fake pods whose new pod answers warm requests only once `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.release.set()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        to_new = request.url.netloc.decode() == NEW and request.url.path != "/metrics"
        if to_new and json.loads(request.content).get("max_tokens") == 1:
            await self.release.wait()
        return self.handler(request)

    def warm_requests(self, host: str = NEW) -> list[list[int]]:
        return [b["prompt"] for h, b in self.requests if h == host and b.get("max_tokens") == 1]


def _config(redis_url: str) -> Any:
    return make_config(
        2,
        directory={
            "backend": "redis",
            "redis": {"url": redis_url, "socket_timeout_seconds": 0.3},
        },
        warmup={
            "ramp_seconds": 0.0,
            "top_prefixes": 4,
            "timeout_seconds": 30.0,
            "share_interval_seconds": 0.2,
        },
    )


@asynccontextmanager
async def _replicas(
    redis_url: str, pods: HeldPods
) -> AsyncIterator[list[tuple[httpx.AsyncClient, RouterRuntime]]]:
    opened = []
    try:
        for _ in range(2):
            runtime = RouterRuntime(_config(redis_url), transport=httpx.MockTransport(pods.handle))
            await runtime.start()
            app = httpx.ASGITransport(app=RouterApp(runtime))
            client = httpx.AsyncClient(transport=app, base_url="http://router", timeout=10)
            opened.append((client, runtime))
        yield opened
    finally:
        for client, runtime in opened:
            await client.aclose()
            await runtime.stop()


async def _traffic(client: httpx.AsyncClient, per_system: int = 3, first: int = 0) -> list[str]:
    chosen = []
    for system in SYSTEMS:
        for i in range(per_system):
            body = {"model": "m", "prompt": system + [first + i] * 40, "max_tokens": 4}
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            chosen.append(answer.headers["x-kvgate-endpoint"])
    return chosen


async def _join(runtime: RouterRuntime) -> None:
    specs = [ep.spec for ep in runtime.endpoints.in_pool(POOL)]
    specs.append(EndpointSpec(NEW, POOL, "http://pod2:8000", generation="static"))
    await runtime.endpoints.replace_pool(POOL, specs)


async def _state(client: httpx.AsyncClient) -> dict[str, Any]:
    debug = (await client.get("/debug/warm")).json()
    return next(e for e in debug["endpoints"] if e["endpoint"] == NEW)


async def _until(check: Callable[[], Any], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _count(runtime: RouterRuntime, name: str, labels: dict[str, str]) -> float:
    return runtime.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_joining_pod_gets_one_set_of_warm_requests_and_the_other_replica_follows(
    redis_url: str,
) -> None:
    pods = HeldPods()
    async with _replicas(redis_url, pods) as replicas:
        for client, _ in replicas:
            await _traffic(client)

        async def counts_shared() -> bool:
            views = [(await c.get("/debug/warm")).json()["peer_replicas"] for c, _ in replicas]
            return views == [{POOL: 1}, {POOL: 1}]

        await _until(counts_shared)  # each has read the other's hot-prefix counts
        pods.release.clear()  # the claimant's warm requests wait at the pod
        for _, runtime in replicas:
            await _join(runtime)

        async def decided() -> bool:
            roles = {(await _state(c))["role"] for c, _ in replicas}
            return roles == {"claimed", "following"}

        await _until(decided)
        states = [await _state(c) for c, _ in replicas]
        claimant = next(k for k, s in enumerate(states) if s["role"] == "claimed")
        follower = 1 - claimant
        (f_client, f_runtime), (_, c_runtime) = replicas[follower], replicas[claimant]
        assert states[follower]["warmed_by"] == c_runtime.warm_sharer.replica
        assert states[follower]["phase"] == states[claimant]["phase"] == "warming"
        # While the other replica warms it, the follower sends it no client request.
        assert NEW not in await _traffic(f_client, per_system=4, first=100)
        assert (await _state(f_client))["phase"] == "warming"

        pods.release.set()

        async def all_warm() -> bool:
            return [(await _state(c))["phase"] for c, _ in replicas] == ["warm", "warm"]

        await _until(all_warm)
        assert sorted(pods.warm_requests()) == sorted(SYSTEMS)  # one set, not two
        assert (await _state(f_client))["warm_requests"] == 0
        warmups = "kvgate_router_warmups_total"
        assert _count(f_runtime, warmups, {"pool": POOL, "result": "followed"}) == 1
        assert _count(c_runtime, warmups, {"pool": POOL, "result": "warmed"}) == 1
        for _, runtime in replicas:
            errors = runtime.metrics.registry.get_sample_value
            assert not any(
                errors("kvgate_router_warm_sharing_errors_total", {"pool": POOL, "operation": op})
                for op in ("claim", "follow", "done", "publish")
            )


async def test_with_redis_down_each_replica_warms_the_pod_on_its_own(
    redis_server_factory: Any,
) -> None:
    redis = redis_server_factory()
    pods = HeldPods()
    async with _replicas(redis.url, pods) as replicas:
        for client, _ in replicas:
            await _traffic(client)
        redis.stop()
        for _, runtime in replicas:
            await _join(runtime)

        async def all_warm() -> bool:
            return [(await _state(c))["phase"] for c, _ in replicas] == ["warm", "warm"]

        await _until(all_warm)
        for client, runtime in replicas:
            state = await _state(client)
            assert state["role"] == "own" and state["succeeded"] == 2, state
            assert (
                _count(
                    runtime,
                    "kvgate_router_warm_sharing_errors_total",
                    {"pool": POOL, "operation": "claim"},
                )
                == 1
            )
        # exactly as without sharing: each replica sent the new pod its own set
        assert sorted(pods.warm_requests()) == sorted(SYSTEMS * 2)
