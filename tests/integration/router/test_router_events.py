"""Exact routing from real KV events: the router hashes token-id prompts as the pods do
(PYTHONHASHSEED=0 in the simulator's environment), subscribes to every pod's ZMQ events, and
routes a prompt that extends a cached one to the pod whose events announced it. The pods run as
one `kvgate sim fleet` process, which binds each pod's event sockets on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.conftest import free_port
from tests.integration.router.conftest import serve_router

from kvgate.api.router_config import RouterConfig


async def test_events_drive_exact_routing(sim_fleet, client):
    fleet, events, replay = sim_fleet(3)
    config = RouterConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"hash_seed": "0"},  # the simulator runs with PYTHONHASHSEED=0
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
            ],
        }
    )
    async with serve_router(config) as (base, runtime):
        await asyncio.sleep(0.3)  # ZMQ subscriptions connect (slow joiner)
        prompt = list(range(1000, 1000 + 640))  # 40 blocks of 16
        first = await client.post(
            base + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 4}
        )
        assert first.status_code == 200, first.text
        holder = first.headers["x-kvgate-endpoint"]
        longer = {"model": "m", "prompt": [*prompt, *range(5000, 5100)], "max_tokens": 4}
        # The holder's BlockStored events reach the directory (no routing history: exact pods).
        for _ in range(100):
            explained = (await client.post(base + "/debug/route", json=longer)).json()
            if explained["decision"]["predicted_hit_tokens"] >= 640:
                break
            await asyncio.sleep(0.05)
        assert explained["keys_exact"] is True
        assert explained["decision"]["endpoint"] == holder
        assert explained["decision"]["predicted_hit_tokens"] == 640
        index = runtime.indexes["default/p"]
        assert await index.pods() >= {holder}
        second = await client.post(base + "/v1/completions", json=longer)
        assert second.headers["x-kvgate-endpoint"] == holder
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 640
        metrics = (await client.get(base + "/metrics")).text
        assert 'kvgate_directory_events_total{pool="default/p",type="BlockStored"}' in metrics


async def test_chat_prompts_are_keyed_exactly_with_the_pods_tokenizer(sim_fleet, client):
    tokenizer = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
    fleet, events, _replay = sim_fleet(2, "--tokenizer", tokenizer)
    config = RouterConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"hash_seed": "0", "tokenizer": {"path": tokenizer}},
                    "endpoints": {
                        "static": [
                            {"url": url, "kv_events": f"tcp://127.0.0.1:{events + i}"}
                            for i, url in enumerate(fleet.urls())
                        ]
                    },
                }
            ],
        }
    )
    async with serve_router(config) as (base, _):
        await asyncio.sleep(0.3)
        history = [
            {"role": "system", "content": "You are a code review agent. " * 60},
            {"role": "user", "content": "Review the first file."},
        ]
        body = {"model": "m", "messages": history, "max_tokens": 4}
        first = await client.post(base + "/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        holder = first.headers["x-kvgate-endpoint"]
        prompt_tokens = first.json()["usage"]["prompt_tokens"]
        turn2 = {
            **body,
            "messages": [
                *history,
                first.json()["choices"][0]["message"],
                {"role": "user", "content": "Now the second."},
            ],
        }
        for _ in range(100):  # until the holder's events are in the directory
            explained = (await client.post(base + "/debug/route", json=turn2)).json()
            if explained["decision"]["predicted_hit_tokens"] > 0:
                break
            await asyncio.sleep(0.05)
        assert explained["keys_exact"] is True
        # The router's token count is the pod's: same template, same tokenizer.
        assert explained["prompt_tokens"] > prompt_tokens
        assert explained["decision"]["endpoint"] == holder
        predicted = explained["decision"]["predicted_hit_tokens"]
        assert predicted >= (prompt_tokens // 16 - 1) * 16
        second = await client.post(base + "/v1/chat/completions", json=turn2)
        assert second.headers["x-kvgate-endpoint"] == holder
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == predicted
