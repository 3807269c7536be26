"""`kvgate indexer` alone writes the pods' KV events to Redis; a router without an embedded
indexer routes exactly on what it wrote."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import yaml
from tests.integration.conftest import free_port
from tests.integration.router.conftest import serve_router

from kvgate.api.router_config import RouterConfig


async def test_standalone_indexer_feeds_the_routers_directory(
    sim_fleet, redis_url, client, tmp_path
):
    fleet, events, replay = sim_fleet(2)
    pool = {
        "name": "p",
        "model": "m",
        "engine": {"hash_seed": "0"},
        "endpoints": {
            "static": [
                {
                    "url": url,
                    "kv_events": f"tcp://127.0.0.1:{events + i}",
                    "kv_replay": f"tcp://127.0.0.1:{replay + i}",
                }
                for i, url in enumerate(fleet.urls())
            ]
        },
    }
    directory = {
        "backend": "redis",
        "redis": {"url": redis_url, "socket_timeout_seconds": 2.0},  # a loaded CI machine
        "embedded_indexer": False,
    }
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"pools": [pool], "directory": directory}))
    port = free_port()
    log = (tmp_path / "indexer.log").open("wb")
    indexer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate.cli", "indexer", "--config", str(path),
        "--host", "127.0.0.1", "--port", str(port), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for _ in range(200):
            try:
                if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        config = RouterConfig.model_validate(
            {
                "server": {"host": "127.0.0.1", "port": free_port()},
                "pools": [pool],
                "directory": directory,
            }
        )
        async with serve_router(config) as (base, runtime):
            assert runtime.indexer is None
            await asyncio.sleep(0.3)  # the indexer's subscriptions connect
            prompt = list(range(3000, 3000 + 480))
            # Sent straight to pod 1: only its KV events can tell the router where this is.
            direct = await client.post(
                fleet.urls()[1] + "/v1/completions",
                json={"model": "m", "prompt": prompt, "max_tokens": 2},
            )
            assert direct.status_code == 200
            body = {"model": "m", "prompt": [*prompt, 7, 8, 9], "max_tokens": 2}
            for _ in range(100):
                explained = (await client.post(base + "/debug/route", json=body)).json()
                if explained["decision"]["predicted_hit_tokens"] == 480:
                    break
                await asyncio.sleep(0.05)
            assert explained["decision"]["endpoint"] == f"127.0.0.1:{fleet.ports[1]}"
            assert explained["decision"]["predicted_hit_tokens"] == 480
        metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        assert 'kvgate_directory_events_total{pool="default/p",type="BlockStored"}' in metrics
    finally:
        indexer.terminate()
        await asyncio.wait_for(indexer.wait(), 10)
        log.close()
