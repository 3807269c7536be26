"""Router replicas share their load on each pod through a real Redis, and keep routing without it.

Two real `kvgate router --config` processes over the same `kvgate sim serve` pods and one real
redis-server. The pods' own load is scraped once a minute here, so what one router knows of the
other's requests comes from the exchange alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from tests.integration.router.router_process import RouterProcess

from kvgate.promtext import sum_samples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _config(pod_urls: list[str], redis_url: str, *, share: bool | None) -> dict[str, Any]:
    sharing: dict[str, Any] = {"interval_seconds": 0.02, "ttl_seconds": 0.5}
    if share is not None:  # None: left unset, on because the directory is Redis
        sharing["enabled"] = share
    return {
        "pools": [
            {
                "name": "p",
                "model": "m",
                "engine": {"kv_events": False},
                "endpoints": {"static": [{"url": u} for u in pod_urls]},
            }
        ],
        "policy": {"seed": 1},  # both replicas make the same choices from the same view
        "directory": {
            "backend": "redis",
            "redis": {"url": redis_url, "socket_timeout_seconds": 0.2},
        },
        "load_metrics": {"scrape_interval_seconds": 60.0},
        "load_sharing": sharing,
    }


def _body(i: int) -> dict[str, Any]:
    # Distinct long prompts (no prefix shared), streamed: each is pending prefill on its pod
    # (what the cost model queues a new request behind) until its first token, seconds later.
    return {"model": "m", "prompt": f"request {i} " + "words " * 5000, "max_tokens": 4,
            "stream": True}  # fmt: skip


def _gauge(text: str, name: str) -> float:
    return sum_samples(text, [name]).get(name, 0.0)


async def _wait_gauge(url: str, name: str, value: float, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            got = _gauge((await client.get(url + "/metrics")).text, name)
            if got == value:
                return
            assert time.monotonic() < deadline, (name, got)
            await asyncio.sleep(0.05)


async def _burst(routers: list[RouterProcess], count: int, first: int = 0) -> list[str]:
    """`count` requests, alternately to each router, 150 ms apart, all in flight together; the
    pod each went to."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> str:
            await asyncio.sleep(0.15 * i)
            url = routers[i % len(routers)].url + "/v1/completions"
            answer = await client.post(url, json=_body(first + i))
            assert answer.status_code == 200, answer.text
            return answer.headers["x-kvgate-endpoint"]

        return list(await asyncio.gather(*(one(i) for i in range(count))))


async def _replicas(
    sim_pods: Any, redis_url: str, tmp_path: Any, *, share: bool | None
) -> tuple[list[Any], list[RouterProcess]]:
    pods = sim_pods(4, "--sim-time-scale", "10")
    urls = [p.url for p in pods]
    routers = [RouterProcess(_config(urls, redis_url, share=share), tmp_path) for _ in range(2)]
    for router in routers:
        await router.wait_ready()
    return pods, routers


@pytest.mark.parametrize("share", [None, True], ids=["by-default", "enabled"])
async def test_two_replicas_sharing_load_spread_a_burst(sim_pods, redis_url, tmp_path, share):
    _, routers = await _replicas(sim_pods, redis_url, tmp_path, share=share)
    try:
        for router in routers:
            await _wait_gauge(router.url, "kvgate_router_load_sharing_peers", 1.0)
        chosen = await _burst(routers, 4)
    finally:
        for router in routers:
            router.stop()
    # Each replica saw the other's requests waiting for their prefill: four requests, four pods.
    assert len(set(chosen)) == 4, chosen


async def test_without_sharing_the_same_burst_piles_up(sim_pods, redis_url, tmp_path):
    _, routers = await _replicas(sim_pods, redis_url, tmp_path, share=False)
    try:
        chosen = await _burst(routers, 4)
    finally:
        for router in routers:
            router.stop()
    # Each replica counts only its own: both send their two to the same two "idle" pods.
    assert len(set(chosen)) < 4, chosen


async def test_replicas_keep_routing_while_redis_is_down(sim_pods, redis_server_factory, tmp_path):
    redis = redis_server_factory()
    _, routers = await _replicas(sim_pods, redis.url, tmp_path, share=True)
    try:
        for router in routers:
            await _wait_gauge(router.url, "kvgate_router_load_sharing_peers", 1.0)
        redis.stop()
        async with httpx.AsyncClient(timeout=30) as client:
            for i in range(10):
                url = routers[i % 2].url + "/v1/completions"
                answer = await client.post(url, json=_body(i))
                assert answer.status_code == 200, answer.text
        for router in routers:
            await _wait_gauge(router.url, "kvgate_router_load_sharing_degraded", 1.0)
        redis.start()  # same port
        for router in routers:
            await _wait_gauge(router.url, "kvgate_router_load_sharing_degraded", 0.0)
            await _wait_gauge(router.url, "kvgate_router_load_sharing_peers", 1.0)
        chosen = await _burst(routers, 4, first=100)  # new prompts: no holder to go back to
        assert len(set(chosen)) == 4, chosen
    finally:
        for router in routers:
            router.stop()
    for router in routers:
        assert "Traceback" not in router.log()


async def test_the_other_replica_follows_a_new_prefix_before_the_pods_kv_events(
    sim_fleet, redis_url, tmp_path
):
    """Pods with KV events: the directory hears of a prompt's blocks when the pod has computed
    them. One replica's request in flight is recorded in the shared directory before it is sent,
    so the other replica predicts the hit on its pod while that pod is still computing it (the
    simulator runs 20x slower than a GPU here: a 4,096-token prefill takes seconds)."""
    fleet, events, _ = sim_fleet(3, "--sim-time-scale", "20")
    endpoints = [
        {"url": url, "kv_events": f"tcp://127.0.0.1:{events + i}"}
        for i, url in enumerate(fleet.urls())
    ]
    config = {
        "pools": [
            {"name": "p", "model": "m", "engine": {"hash_seed": "0"},
             "endpoints": {"static": endpoints}}
        ],
        "directory": {"backend": "redis", "redis": {"url": redis_url}},
        "load_sharing": {"interval_seconds": 0.02, "ttl_seconds": 0.5},
    }  # fmt: skip
    routers = [RouterProcess(config, tmp_path) for _ in range(2)]
    prompt = list(range(1000, 1000 + 4096))  # 256 blocks of 16, no pod holds any
    follower = {"model": "m", "prompt": [*prompt, 1, 2, 3], "max_tokens": 4}
    first_chunk_at: list[float] = []
    try:
        for router in routers:
            await router.wait_ready()
            await _wait_gauge(router.url, "kvgate_router_load_sharing_peers", 1.0)
        async with httpx.AsyncClient(timeout=60) as client:

            async def send_first() -> str:
                body = {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": True}
                async with client.stream(
                    "POST", routers[0].url + "/v1/completions", json=body
                ) as answer:
                    assert answer.status_code == 200
                    async for _ in answer.aiter_bytes():
                        first_chunk_at.append(time.monotonic())
                    return answer.headers["x-kvgate-endpoint"]

            sent_at = time.monotonic()
            first = asyncio.create_task(send_first())
            while True:
                explained = await client.post(routers[1].url + "/debug/route", json=follower)
                decision = explained.json()["decision"]
                if decision["predicted_hit_tokens"] >= 4000:
                    seen_at = time.monotonic()
                    break
                assert time.monotonic() - sent_at < 10, decision
                await asyncio.sleep(0.02)
            assert not first_chunk_at, "seen only once the prefill was done"
            assert seen_at - sent_at < 2.0
            holder = await first
    finally:
        for router in routers:
            router.stop()
    assert decision["endpoint"] == holder
