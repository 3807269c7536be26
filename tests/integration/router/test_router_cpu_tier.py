"""A CPU offloading tier end to end: `kvgate sim fleet` pods with a small GPU cache and vLLM's
native CPU offloading (`--kv-offloading-size`) publish `medium: CPU` events when the GPU evicts
a prefix; a router whose pool sets `engine.cpu_offload` indexes them, predicts the hit (priced
as a copy back, not a recompute), routes to the pod, and the engine's `cached_tokens` agrees."""

from __future__ import annotations

import asyncio

import httpx
from tests.integration.conftest import free_port
from tests.integration.router.conftest import serve_router

from kvgate.api.router_config import RouterConfig

BLOCKS = 40  # GPU blocks per pod (39 usable, 624 tokens)
CPU_GIB = 64 * 16 * 131072 / 1024**3  # 64 blocks of the default profile's 128 KiB a token


def config(urls: list[str], events: int, replay: int, cpu_offload: bool) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"hash_seed": "0", "cpu_offload": cpu_offload},
                    "endpoints": {
                        "static": [
                            {
                                "url": url,
                                "kv_events": f"tcp://127.0.0.1:{events + i}",
                                "kv_replay": f"tcp://127.0.0.1:{replay + i}",
                            }
                            for i, url in enumerate(urls)
                        ]
                    },
                }
            ],
        }
    )


async def test_cpu_tier_hits_are_indexed_priced_and_real(sim_fleet, client):
    fleet, events, replay = sim_fleet(
        2, "--num-gpu-blocks-override", str(BLOCKS), "--max-model-len", "560",
        "--kv-offloading-backend", "native", "--kv-offloading-size", str(CPU_GIB),
    )  # fmt: skip
    prompt = list(range(1000, 1000 + 400))  # 25 blocks
    async with serve_router(config(fleet.urls(), events, replay, True)) as (base, _runtime):
        await asyncio.sleep(0.3)  # ZMQ subscriptions connect (slow joiner)
        first = await client.post(
            base + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}
        )
        assert first.status_code == 200, first.text
        holder = first.headers["x-kvgate-endpoint"]
        holder_url = next(u for u in fleet.urls() if u.endswith(":" + holder.rsplit(":", 1)[-1]))
        # Other clients' prompts fill the holder's GPU: the prefix goes to its CPU tier.
        async with httpx.AsyncClient(timeout=30) as direct:
            for i in range(2):
                other = list(range(10_000 * (i + 1), 10_000 * (i + 1) + 400))
                r = await direct.post(
                    holder_url + "/v1/completions",
                    json={"model": "m", "prompt": other, "max_tokens": 2},
                )
                assert r.status_code == 200
        longer = {"model": "m", "prompt": [*prompt, *range(7000, 7032)], "max_tokens": 2}
        for _ in range(100):
            explained = (await client.post(base + "/debug/route", json=longer)).json()
            line = next(c for c in explained["decision"]["candidates"] if c["endpoint"] == holder)
            if line["cpu_hit_tokens"] > 0:
                break
            await asyncio.sleep(0.05)
        assert explained["decision"]["endpoint"] == holder
        assert line["hit_tokens"] == 400 and line["cpu_hit_tokens"] > 0
        cold = next(c for c in explained["decision"]["candidates"] if c["endpoint"] != holder)
        assert line["prefill_seconds"] < cold["prefill_seconds"]
        second = await client.post(base + "/v1/completions", json=longer)
        assert second.headers["x-kvgate-endpoint"] == holder
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 400
