"""The router with a real Redis directory: shared between two routers, and Redis going away
never fails a request (the local view takes over, and Redis is resynchronised when it returns)."""

from __future__ import annotations

import asyncio

from tests.integration.router.conftest import pool_config, serve_router

from kvgate.promtext import sum_samples

SYSTEM = {"role": "system", "content": "Shared instructions for every agent. " * 80}


def _gauge(text: str, name: str) -> float:
    return sum_samples(text, [name]).get(name, 0.0)


async def _two_routers_share(sim_pods, directory, client) -> None:
    """A prefix one router sent to a pod is found by a second router through the directory."""
    pods = sim_pods(3)
    urls = [p.url for p in pods]
    async with (
        serve_router(pool_config(urls, directory=directory)) as (first, _),
        serve_router(pool_config(urls, directory=directory)) as (second, runtime),
    ):
        messages = [SYSTEM, {"role": "user", "content": "Question one?"}]
        body = {"model": "m", "messages": messages, "max_tokens": 4}
        resp = await client.post(first + "/v1/chat/completions", json=body)
        holder = resp.headers["x-kvgate-endpoint"]
        # The other router never saw this prefix, but reads where the first one sent it.
        follow = {**body, "messages": [SYSTEM, {"role": "user", "content": "Question two?"}]}
        resp = await client.post(second + "/v1/chat/completions", json=follow)
        assert resp.headers["x-kvgate-endpoint"] == holder
        assert resp.headers["x-kvgate-decision"] == "prefix-hit"
        assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 500
        metrics = (await client.get(second + "/metrics")).text
        assert _gauge(metrics, "kvgate_directory_fallback_degraded") == 0
        assert holder in await runtime.indexes["default/p"].pods()


async def test_two_routers_share_routing_history_through_redis(sim_pods, redis_url, client):
    directory = {"backend": "redis", "redis": {"url": redis_url, "socket_timeout_seconds": 1.0}}
    await _two_routers_share(sim_pods, directory, client)


async def test_redis_outage_costs_no_request(sim_pods, redis_server_factory, client):
    pods = sim_pods(2)
    redis = redis_server_factory()
    directory = {
        "backend": "redis",
        "redis": {"url": redis.url, "socket_timeout_seconds": 0.2, "resync_interval_seconds": 0.2},
    }
    async with serve_router(pool_config([p.url for p in pods], directory=directory)) as (
        base,
        runtime,
    ):
        body = {
            "model": "m",
            "messages": [SYSTEM, {"role": "user", "content": "q"}],
            "max_tokens": 4,
        }
        assert (await client.post(base + "/v1/chat/completions", json=body)).status_code == 200
        redis.stop()
        statuses = [
            (await client.post(base + "/v1/chat/completions", json=body)).status_code
            for _ in range(5)
        ]
        assert statuses == [200] * 5
        metrics = (await client.get(base + "/metrics")).text
        assert _gauge(metrics, "kvgate_directory_fallback_degraded") == 1.0
        redis.start()
        for _ in range(50):
            await client.post(base + "/v1/chat/completions", json=body)
            metrics = (await client.get(base + "/metrics")).text
            if _gauge(metrics, "kvgate_directory_fallback_degraded") == 0.0:
                break
            await asyncio.sleep(0.1)
        assert _gauge(metrics, "kvgate_directory_fallback_degraded") == 0.0
        index = runtime.indexes["default/p"]
        assert not index.degraded


async def test_two_routers_share_a_redis_cluster_directory(sim_pods, redis_cluster_url, client):
    """The same on a three-master Redis Cluster (`cluster: true`, the URL names one node)."""
    redis = {"url": redis_cluster_url, "cluster": True, "socket_timeout_seconds": 1.0}
    await _two_routers_share(sim_pods, {"backend": "redis", "redis": redis}, client)
