"""LoRA adapters end to end: simulated pods serving several adapters (`--enable-lora
--lora-modules ... --max-loras`), publishing adapter-aware KV events, and the router hashing
adapter requests with the adapter's extra keys and preferring pods that already run it
(`vllm:lora_requests_info`).

The last test is the measurement (docs/router.md, "LoRA adapters"): one multi-adapter workload
through the real router under three policies, TTFT read in the simulator's virtual GPU time
(`x-sim-ttft-seconds`), so the 2-core machine's noise does not decide the comparison.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

import httpx
from tests.integration.conftest import free_port
from tests.integration.router.conftest import serve_router

from kvgate.api.router_config import RouterConfig

ADAPTERS = [f"a{i}" for i in range(4)]
LORA_FLAGS = (
    "--enable-lora", "--max-loras", "1", "--sim-lora-load-seconds", "0.2",
    "--lora-modules", *(f"{a}=/adapters/{a}" for a in ADAPTERS),
)  # fmt: skip


def config(
    fleet: Any, events: int, replay: int, policy: dict[str, Any] | None = None
) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"hash_seed": "0"},  # the simulator runs with PYTHONHASHSEED=0
                    "lora_adapters": [{"name": a, "path": f"/adapters/{a}"} for a in ADAPTERS],
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
            "policy": {"seed": 7, **(policy or {})},
            "load_metrics": {"scrape_interval_seconds": 0.05},
        }
    )


async def complete(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int = 4
) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    response = await client.post(url + "/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


async def test_adapter_requests_are_keyed_with_the_adapter(sim_fleet, client):
    fleet, events, replay = sim_fleet(2, *LORA_FLAGS)
    async with serve_router(config(fleet, events, replay)) as (base, _runtime):
        await asyncio.sleep(0.3)  # ZMQ subscriptions connect (slow joiner)
        prompt = list(range(1000, 1000 + 640))  # 40 blocks of 16
        first = await complete(client, base, "a1", prompt)
        holder = first.headers["x-kvgate-endpoint"]
        longer = [*prompt, *range(5000, 5100)]
        for _ in range(100):  # the holder's adapter-keyed BlockStored events reach the router
            plan = await client.post(base + "/debug/route", json={"model": "a1", "prompt": longer})
            if int(plan.headers.get("x-kvgate-prefix-hit-tokens", "0")) > 0:
                break
            await asyncio.sleep(0.05)
        again = await complete(client, base, "a1", longer)
        assert again.headers["x-kvgate-endpoint"] == holder
        assert int(again.headers["x-kvgate-prefix-hit-tokens"]) >= 600
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 600
        # The same tokens for the base model or another adapter are other blocks in vLLM.
        for model in ("m", "a2"):
            other = await client.post(
                base + "/debug/route", json={"model": model, "prompt": longer}
            )
            assert other.status_code == 200
            assert other.headers["x-kvgate-prefix-hit-tokens"] == "0", model


async def test_a_request_goes_to_the_pod_already_running_its_adapter(sim_fleet, client):
    fleet, events, replay = sim_fleet(2, *LORA_FLAGS)
    pod_a, pod_b = fleet.urls()
    async with serve_router(config(fleet, events, replay)) as (base, runtime):
        # Long-running requests straight to the pods: a0 holds pod A's only adapter slot, a1 B's.
        hogs = [
            asyncio.create_task(complete(client, pod_a, "a0", list(range(100, 164)), 2000)),
            asyncio.create_task(complete(client, pod_b, "a1", list(range(200, 264)), 2000)),
        ]
        endpoints = {ep.spec.url: ep for ep in runtime.endpoints.all()}
        for _ in range(200):  # until the scraper has seen both pods' lora_requests_info
            await asyncio.sleep(0.05)
            if endpoints[pod_a].load.running_lora_adapters == {"a0"} and endpoints[
                pod_b
            ].load.running_lora_adapters == {"a1"}:
                break
        assert endpoints[pod_b].load.running_lora_adapters == {"a1"}
        assert endpoints[pod_b].load.max_lora == 1
        # No shared prefix, and runs of one adapter (spreading alone would alternate pods):
        # only the adapter tells the pods apart.
        for adapter, pod in (("a1", pod_b), ("a0", pod_a), ("a1", pod_b)):
            for i in range(4):
                prompt = list(range(10_000 + 100 * i, 10_000 + 100 * i + 64))
                response = await complete(client, base, adapter, prompt)
                assert endpoints[pod].spec.id == response.headers["x-kvgate-endpoint"], adapter
        for hog in hogs:
            hog.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)


async def _workload_ttfts(base: str, client: httpx.AsyncClient, seed: int) -> list[float]:
    """96 requests, 6 at a time; each names one of 4 adapters at random and carries that
    adapter's 256-token instructions plus 512 tokens of its own."""
    rng = random.Random(seed)
    instructions = {
        a: list(range(20_000 + 1000 * i, 20_000 + 1000 * i + 256)) for i, a in enumerate(ADAPTERS)
    }
    jobs = []
    for _ in range(96):
        adapter = rng.choice(ADAPTERS)
        own = [rng.randrange(100, 30_000) for _ in range(512)]
        jobs.append((adapter, instructions[adapter] + own))
    queue = list(jobs)
    ttfts: list[float] = []

    async def worker() -> None:
        while queue:
            adapter, prompt = queue.pop(0)
            response = await complete(client, base, adapter, prompt, max_tokens=32)
            ttfts.append(float(response.headers["x-sim-ttft-seconds"]))

    await asyncio.gather(*(worker() for _ in range(6)))
    return ttfts


async def test_measure_adapter_aware_routing_on_a_multi_adapter_workload(sim_fleet, client, capsys):
    """Prints mean and p90 virtual TTFT per policy (docs/router.md quotes a run)."""
    policies = {
        "round-robin": {"name": "round-robin"},
        "kvgate, LoRA terms off": {
            "params": {"cost_model": {"lora_load_seconds": 0.0, "lora_slot_wait_seconds": 0.0}}
        },
        # The engines' adapter load time (--sim-lora-load-seconds above), as a user would set it.
        "kvgate": {"params": {"cost_model": {"lora_load_seconds": 0.2}}},
    }
    results: dict[str, list[float]] = {}
    for label, policy in policies.items():
        fleet, events, replay = sim_fleet(4, *LORA_FLAGS)  # fresh pods: nothing cached or loaded
        async with serve_router(config(fleet, events, replay, policy)) as (base, _runtime):
            await asyncio.sleep(0.5)  # KV-event subscriptions and a first scrape
            results[label] = await _workload_ttfts(base, client, seed=3)
        fleet.stop()
    with capsys.disabled():
        print("\npolicy                   mean TTFT s   p90 TTFT s   (virtual GPU time)")
        for label, ttfts in results.items():
            p90 = statistics.quantiles(ttfts, n=10)[-1]
            print(f"{label:24} {statistics.mean(ttfts):11.3f} {p90:12.3f}")
    kvgate = statistics.mean(results["kvgate"])
    assert kvgate < 0.8 * statistics.mean(results["round-robin"])
    assert kvgate <= statistics.mean(results["kvgate, LoRA terms off"])
