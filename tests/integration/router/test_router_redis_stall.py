"""A Redis stall under traffic loses no cache hits for good.

Real simulated pods publish KV events to a real router (embedded indexer, Redis directory, the
default socket timeout unless stated); redis-server is frozen with SIGSTOP while requests with
new prompts keep arriving: for 0.3 s (within the 0.5 s default timeout: calls just wait; with
the old 50 ms default they time out) and for 1 s (calls time out, the subscriber's writes of the
new blocks are lost in Redis). After SIGCONT, the router must predict, for each of those prompts sent again, exactly the prefix hit the engine
then reports (`x-kvgate-prefix-hit-tokens` == `usage.prompt_tokens_details.cached_tokens`), and
so must a second router that reads only Redis: the shared directory says again what the
engines hold, instead of having been cleared for the pods whose writes were lost.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from tests.integration.conftest import free_port
from tests.integration.router.conftest import serve_router

from kvgate.api.router_config import RouterConfig
from kvgate.directory.fallback import FallbackIndex

BLOCK = 16


def prompt(i: int) -> list[int]:
    """21 full blocks plus 5 tokens (the engine caches the full blocks), distinct per `i` from
    the first block on, every id inside the simulator's 32,000-token vocabulary."""
    head = [1 + i % 31_000, 1 + i // 31_000]
    return head + [1 + (31 * i + t) % 31_000 for t in range(21 * BLOCK + 3)]


def config(
    pool: dict[str, Any], redis_url: str, *, embedded: bool, timeout: float | None = None
) -> RouterConfig:
    redis: dict[str, Any] = {"url": redis_url}  # the default resync interval
    if timeout is not None:
        redis["socket_timeout_seconds"] = timeout
    return RouterConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "pools": [pool],
            "directory": {
                "backend": "redis",
                "redis": redis,
                "embedded_indexer": embedded,
            },
            "policy": {"seed": 3},
        }
    )


async def complete(client: httpx.AsyncClient, base: str, tokens: list[int]) -> tuple[int, int, str]:
    """(predicted hit tokens, engine-reported cached tokens, endpoint) of one completion."""
    body = {"model": "m", "prompt": tokens, "max_tokens": 2}
    resp = await client.post(base + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    cached = resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    predicted = int(resp.headers["x-kvgate-prefix-hit-tokens"])
    return predicted, cached, resp.headers["x-kvgate-endpoint"]


@pytest.mark.parametrize(
    ("stall_seconds", "socket_timeout"),
    [
        (0.3, None),  # within the default socket timeout (0.5 s): calls just wait
        (0.3, 0.05),  # the case: the old 50 ms default times out, writes are lost
        (1.0, None),  # longer than the default timeout
    ],
)
async def test_predicted_hits_match_the_engines_after_a_redis_stall(
    sim_fleet, redis_server_factory, client, stall_seconds, socket_timeout
):
    redis = redis_server_factory()
    fleet, events, replay = sim_fleet(2)
    pool = {
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
    async with (
        serve_router(config(pool, redis.url, embedded=True, timeout=socket_timeout)) as (
            base,
            runtime,
        ),
        serve_router(config(pool, redis.url, embedded=False)) as (reader, _),
    ):
        index = runtime.indexes["default/p"]
        assert isinstance(index, FallbackIndex)
        await asyncio.sleep(0.3)  # ZMQ subscriptions connect (slow joiner)
        before = prompt(0)
        await complete(client, base, before)

        sent: list[list[int]] = []
        latencies: list[float] = []

        lost_writes = False

        async def traffic(offset: int, until: float) -> None:
            nonlocal lost_writes
            i = offset
            while time.monotonic() < until:
                tokens = prompt(i)
                started = time.monotonic()
                await complete(client, base, tokens)  # never fails, even while Redis is frozen
                latencies.append(time.monotonic() - started)
                sent.append(tokens)
                lost_writes |= bool(index.unsynced)
                i += 10

        async def stall() -> None:
            redis.pause()
            try:
                await asyncio.sleep(stall_seconds)
            finally:
                redis.resume()

        stop_at = time.monotonic() + stall_seconds
        await asyncio.gather(stall(), *(traffic(o, stop_at) for o in (1, 2, 3)))
        assert sent, "no request during the stall"
        print(
            f"\n{stall_seconds} s stall, timeout {socket_timeout or 'default'}: {len(sent)} requests, "
            f"slowest {max(latencies):.3f} s"
        )
        metrics = (await client.get(base + "/metrics")).text
        if stall_seconds < (socket_timeout or 0.5):  # within the socket timeout: calls just waited
            assert "kvgate_directory_fallback_errors_total{" not in metrics
            assert not lost_writes
        else:  # calls timed out; the blocks computed meanwhile did not reach Redis
            assert "kvgate_directory_fallback_errors_total{" in metrics
            assert lost_writes

        deadline = time.monotonic() + 15
        while index.unsynced or index.degraded or index.resync_task is not None:
            assert time.monotonic() < deadline, f"not resynced: {index.unsynced}"
            await client.post(base + "/debug/route", json={"model": "m", "prompt": [1, 2]})
            await asyncio.sleep(0.1)

        await asyncio.sleep(0.5)  # load scrapes see idle pods again
        full = 21 * BLOCK  # what the engine caches of each prompt
        routed_to_holder = 0
        for tokens in [before, *sent]:
            body = {"model": "m", "prompt": tokens, "max_tokens": 2}
            # Both directories (this router's; Redis alone, as the second router reads it)
            # know a pod that holds the prompt's blocks...
            for router in (base, reader):
                decision = (await client.post(router + "/debug/route", json=body)).json()
                hits = [c["hit_tokens"] for c in decision["decision"]["candidates"]]
                assert max(hits) == full, (router, sent.index(tokens) if tokens in sent else -1)
            # ...and the router's prediction is what the engine then reports, on whichever
            # pod it chose (load may send a request away from the holder).
            predicted, cached, _endpoint = await complete(client, base, tokens)
            assert predicted == cached
            routed_to_holder += cached == full
        print(
            f"after: {len(sent) + 1} prompts, predicted == cached for all, {routed_to_holder} hits"
        )
        assert routed_to_holder >= 0.5 * (len(sent) + 1)  # the claim above is not vacuous
