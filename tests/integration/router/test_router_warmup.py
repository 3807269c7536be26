"""A pod that joins is warmed with the hot prefixes before it takes client requests.

Real `kvgate router --config` process, real `kvgate sim serve` pods; the third pod joins by a
config reload (static endpoints) and is slow (`--sim-time-scale 20`), so its warm-up lasts long
enough to watch: no client request reaches it until its warm requests are answered, and then it
holds the shared system prompt.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml
from tests.integration.router.router_process import TOKENIZER, RouterProcess, router_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SYSTEM = " ".join(f"rule{i} keep answers short and cite the cache" for i in range(60))
HEADERS = {"content-type": "application/json"}


def _chat(question: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": 2,
    }


async def _warm_state(client: httpx.AsyncClient, url: str) -> dict[str, object]:
    debug = (await client.get("/debug/warm")).json()
    host = url.split("//")[1]
    return next((e for e in debug["endpoints"] if e["endpoint"].endswith(host)), {"phase": None})


async def test_a_pod_that_joins_is_warmed_before_it_takes_client_requests(sim_pods, tmp_path):
    old = sim_pods(2, "--tokenizer", TOKENIZER)
    (new,) = sim_pods(1, "--tokenizer", TOKENIZER, "--sim-time-scale", "20")
    config = router_config([p.url for p in old])
    config["warmup"] = {"top_prefixes": 4, "ramp_seconds": 0.0, "timeout_seconds": 60.0}
    router = RouterProcess(config, tmp_path)
    try:
        await router.wait_ready()
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            for i in range(6):
                answer = await client.post("/v1/chat/completions", json=_chat(f"question {i}?"))
                assert answer.status_code == 200, answer.text
            hot = (await client.get("/debug/warm")).json()["top"]["default/p"]
            assert hot and hot[0]["requests"] >= 2

            config["pools"][0]["endpoints"]["static"].append({"url": new.url})
            server = {"host": "127.0.0.1", "port": router.port}
            path = tmp_path / f"router-{router.port}.yaml"
            path.write_text(yaml.safe_dump({**config, "server": server}))
            deadline = time.monotonic() + 20
            while (state := await _warm_state(client, new.url))["phase"] != "warming":
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.05)

            chosen = set()
            while (state := await _warm_state(client, new.url))["phase"] == "warming":
                answer = await client.post("/v1/chat/completions", json=_chat("while warming?"))
                assert answer.status_code == 200
                chosen.add(answer.headers["x-kvgate-endpoint"])
                assert time.monotonic() < deadline + 40, state
            assert chosen and not any(new.url.split("//")[1] in ep for ep in chosen)
            assert state["succeeded"] >= 1 and state["failed"] == 0, state
            metrics = (await client.get("/metrics")).text
            assert 'kvgate_router_warm_requests_total{pool="default/p",result="ok"}' in metrics

        # The new pod holds the shared system prompt: a request sent to it directly hits it.
        async with httpx.AsyncClient(base_url=new.url, timeout=60) as pod:
            answer = await pod.post("/v1/chat/completions", json=_chat("straight to the pod?"))
        usage = answer.json()["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.8 * state["prefill_tokens"], (usage, state)
    finally:
        router.stop()
    assert "Traceback" not in router.log()
