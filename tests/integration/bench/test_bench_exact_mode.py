"""Exact mode as `kvgate bench run --tokenizer DIR --kv-events` sets it up: the bench's per-pod
fleet (one `kvgate sim serve` per pod, each publishing KV events) and a `kvgate router` started
with the bench's own flags. The router must hear the pod's events: the second send of a chat
prompt predicts as many hit tokens as the pod then reports cached (both follow vLLM's rule that
the last prompt token is always recomputed, so the two counts are the same full blocks).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from kvgate.bench.fleet import SimFleet
from kvgate.bench.harness import HarnessSettings, kvgate_router_args
from kvgate.bench.targets import start_target

TOKENIZER = str(Path(__file__).resolve().parents[2] / "data" / "prefix" / "tokenizer")


async def _send(client: httpx.AsyncClient, base_url: str, text: str) -> tuple[int, int]:
    """(router's predicted hit tokens, pod's cached tokens) for one chat request."""
    response = await client.post(
        base_url + "/v1/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 2,
        },
        timeout=30.0,
    )
    assert response.status_code == 200, response.text
    cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return int(response.headers["x-kvgate-prefix-hit-tokens"]), int(cached)


async def test_router_hears_per_pod_kv_events(tmp_path: Path):
    settings = HarnessSettings(pods=1, targets=["prefix"], tokenizer=TOKENIZER, kv_events=True)
    fleet = SimFleet(
        1,
        settings.model,
        tmp_path,
        extra_args=["--tokenizer", TOKENIZER],
        startup_timeout_s=30.0,
        kv_events=True,
    )
    await fleet.start()
    try:
        target = await start_target(
            "prefix",
            fleet.urls,
            settings.model,
            tmp_path,
            startup_timeout_s=30.0,
            extra_args=kvgate_router_args(settings, fleet),
        )
        try:
            async with httpx.AsyncClient() as client:
                await asyncio.sleep(0.5)  # the router's subscriber connects
                text = "The quick brown fox jumps over the lazy dog. " * 40
                first_hit, first_cached = await _send(client, target.base_url, text)
                assert first_hit == 0 and first_cached == 0
                predicted = cached = 0
                for _ in range(20):  # the events reach the router shortly after the answer
                    await asyncio.sleep(0.1)
                    predicted, cached = await _send(client, target.base_url, text)
                    if predicted > 0:
                        break
                assert cached > 0
                assert predicted == cached
        finally:
            await target.stop()
    finally:
        await fleet.stop()
    assert fleet.kv_event_sockets and not _any_socket_left(fleet.kv_event_sockets)


def _any_socket_left(endpoints: list[str]) -> bool:
    return any(Path(e.removeprefix("ipc://")).parent.exists() for e in endpoints)
