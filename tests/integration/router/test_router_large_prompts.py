"""Huge prompts and long session ids against a real router process and real simulated pods.

The router runs as `kvgate router --config` in its own process (its event loop, RSS and CPU
are its own); the pods are `kvgate sim serve` processes; everything is on loopback.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from tests.integration.router.router_process import (
    RouterProcess,
    Samples,
    large_chat_body,
    router_config,
    small_load,
    text_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MB = 1 << 20


async def test_small_requests_stay_fast_while_huge_prompts_are_keyed(sim_pods, tmp_path):
    pods = sim_pods(2)
    # A 1 M-token limit: an 8 MB prompt (~3 M tokens here) passes the character bound and is
    # tokenized, chunk by chunk in a worker, until the count refuses it.
    config = router_config([p.url for p in pods], max_model_len=1 << 20)
    router = RouterProcess(config, tmp_path)
    # Built before the load starts: building them blocks this test's event loop.
    bodies = [large_chat_body(8 * MB, seed) for seed in range(3)]
    try:
        await router.wait_ready()
        samples, phase, stop = Samples(), ["warmup"], asyncio.Event()
        load = asyncio.create_task(small_load(router.url, samples, phase, stop))
        await asyncio.sleep(0.5)
        phase[0] = "without"
        await asyncio.sleep(3.0)
        phase[0] = "with"
        answers = []
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
            for body in bodies[:2]:
                response = await client.post("/v1/chat/completions", content=body, headers=headers)
                answers.append((response.status_code, response.json()["error"]["code"]))
            debug = await client.post("/debug/route", content=bodies[2], headers=headers)
        phase[0] = "after"
        await asyncio.sleep(1.0)
        stop.set()
        await load
    finally:
        router.stop()
    assert answers == [(400, "context_length_exceeded")] * 2
    assert debug.status_code == 400
    assert not samples.errors, samples.errors[:5]
    assert len(samples.by_phase["with"]) >= 20, samples.by_phase.keys()
    added = samples.quantile("with", 0.99) - samples.quantile("without", 0.99)
    # Generous (the machine is shared and noisy); with keying on the loop, or behind a global
    # lock, small requests waited for whole seconds.
    assert added < 0.25, (added, samples.quantile("without", 0.99))
    assert "Traceback" not in router.log()


async def test_router_memory_stays_bounded_under_huge_prompts_and_long_session_ids(
    sim_pods, tmp_path
):
    pods = sim_pods(2)
    router = RouterProcess(router_config([p.url for p in pods]), tmp_path)  # defaults
    statuses: dict[int, int] = {}
    try:
        await router.wait_ready()
        start_rss = router.rss_bytes()
        rng = random.Random(1)
        base = text_of(4 * MB, rng)
        queue: asyncio.Queue[tuple[str, bytes, dict[str, str]] | None] = asyncio.Queue(4)

        async def producer() -> None:
            for i in range(24):  # distinct 4 MB prompts: chat and completions, new sessions
                at = rng.randrange(len(base))
                text = f"[{i}] " + base[at:] + base[:at]
                session = {"x-session-id": f"big-{i}-" + "s" * 4096}
                if i % 2:
                    body = {"model": "m", "prompt": text, "max_tokens": 1}
                    await queue.put(("/v1/completions", json.dumps(body).encode(), session))
                else:
                    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
                    await queue.put(("/v1/chat/completions", json.dumps(body).encode(), session))
            for i in range(2000):  # distinct 4 KB session ids on small requests
                session = {"x-session-id": f"{i}-" + "k" * 4096}
                body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]}
                await queue.put(("/v1/chat/completions", json.dumps(body).encode(), session))
            for _ in range(4):
                await queue.put(None)

        async def sender() -> None:
            async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
                while (item := await queue.get()) is not None:
                    path, content, headers = item
                    headers = {**headers, "content-type": "application/json"}
                    response = await client.post(path, content=content, headers=headers)
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        await asyncio.gather(producer(), *(sender() for _ in range(4)))
        end_rss = router.rss_bytes()
    finally:
        router.stop()
    # Over the default 2^20-token cap: refused after counting, never kept. Small ones: routed.
    assert statuses == {400: 24, 200: 2000}, statuses
    # Before the fix each distinct 4 MB prompt kept ~50 MB and each 4 KB id ~4.5 KB.
    assert end_rss < 300 * MB, (start_rss / MB, end_rss / MB)
    assert "Traceback" not in router.log()
