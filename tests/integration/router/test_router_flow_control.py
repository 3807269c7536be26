"""Flow control with a real `kvgate router` process in front of real `kvgate sim serve` pods:
saturated pods make requests wait instead of 503, a short prompt leaves the queue before a long
one sent just before it, a deadline that cannot be met is a 429 with `retry-after`, a client
that leaves while queued is taken out of the queue, and shutdown answers what is still queued
at the end of its grace."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import RouterProcess as EdgeRouterProcess
from tests.integration.router.edge_helpers import router_config as edge_router_config
from tests.integration.router.router_process import RouterProcess

pytestmark = pytest.mark.integration

# One sequence at a time, in real time: the pod queues everything past its one running request
# (what `vllm:num_requests_waiting` then reports), and a 200-token answer takes ~2 s.
POD_FLAGS = ("--max-num-seqs", "1", "--sim-time-scale", "1.0")
BATCH = {"x-kvgate-class": "batch"}


def _body(text: str, max_tokens: int = 200) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
    }


def _config(urls: list[str], **flow: Any) -> dict[str, Any]:
    return {
        "pools": [{"name": "p", "model": "m", "endpoints": {"static": [{"url": u} for u in urls]}}],
        "policy": {"seed": 3},
        "flow_control": {"max_waiting_requests": 1, **flow},
    }


@pytest.fixture
async def start_router(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    routers: list[RouterProcess] = []

    async def start(config: dict[str, Any]) -> RouterProcess:
        router = RouterProcess(config, tmp_path)
        routers.append(router)
        await router.wait_ready()
        return router

    yield start
    for router in routers:
        router.stop()


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> Any:
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        payload = await r.aread()
    return r.status_code, r.headers, payload


async def _metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()) and re.match(
            rf"{name}(\{{|\s|$)", head + " "
        ):
            total += float(value)
    return total


async def _until(check: Callable[[], Any], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_batch_requests_wait_for_a_busy_pod_instead_of_503(sim_pods, start_router):
    (pod,) = sim_pods(1, *POD_FLAGS)
    for flow in (False, True):
        router = await start_router(_config([pod.url], enabled=flow))
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            busy = await _occupy(client, pod.url, f"busy {flow}")
            await asyncio.sleep(0.3)  # the router's scrapes (every 100 ms) see it too
            answers = await asyncio.gather(
                *(_stream(client, _body(f"batch {flow} {i}", 8), BATCH) for i in range(3))
            )
            statuses = [status for status, _, _ in answers]
            if not flow:
                # The quick-start's one pool is online: batch may not borrow a queueing pod.
                assert statuses == [503] * 3
            else:
                assert statuses == [200] * 3
                assert all(b"[DONE]" in payload for _, _, payload in answers)
                waited = await _metric(
                    client,
                    "kvgate_router_queue_wait_seconds_count",
                    outcome="dispatched",
                    request_class="batch",
                )
                assert waited == 3  # every one of them waited in the router's queue
                assert await _metric(client, "kvgate_router_queued_requests") == 0
            for task in busy:
                assert (await task)[0] == 200
        router.stop()


async def test_a_deadline_that_cannot_be_met_is_a_429_with_retry_after(sim_pods, start_router):
    (pod,) = sim_pods(1, *POD_FLAGS)
    router = await start_router(_config([pod.url]))
    async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
        busy = await _occupy(client, pod.url, "busy")
        status, headers, payload = await _stream(
            client, _body("in a hurry", 4), {"x-kvgate-deadline-ms": "300"}
        )
        assert status == 429, payload
        error = httpx.Response(200, content=payload).json()["error"]
        assert error["code"] == "deadline_exceeded" and error["type"] == "rate_limit_error"
        assert int(headers["retry-after"]) >= 1
        refused = await _metric(
            client, "kvgate_router_queue_refusals_total", reason="deadline_exceeded"
        )
        assert refused == 1
        # A bad deadline header is the client's mistake.
        status, _, _ = await _stream(client, _body("bad", 4), {"x-kvgate-deadline-ms": "soon"})
        assert status == 400
        # Without a deadline of its own it waits and is answered.
        status, _, payload = await _stream(client, _body("patient", 4), {})
        assert status == 200 and b"[DONE]" in payload
        for task in busy:
            assert (await task)[0] == 200


async def test_a_client_that_leaves_while_queued_is_removed(sim_pods, start_router):
    (pod,) = sim_pods(1, *POD_FLAGS)
    router = await start_router(_config([pod.url]))
    async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
        busy = await _occupy(client, pod.url, "busy")
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as leaving:
            gone = asyncio.create_task(_stream(leaving, _body("leaves", 4), {}))
            await _until(lambda: _queued(client, 1))
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone

        await _until(lambda: _queued(client, 0))
        cancelled = await _metric(
            client, "kvgate_router_queue_wait_seconds_count", outcome="cancelled"
        )
        assert cancelled == 1
        assert await _metric(client, "kvgate_router_queued_bytes") == 0
        for task in busy:
            assert (await task)[0] == 200
        # The pod never saw the request that left: two busy answers, nothing else.
        async with httpx.AsyncClient(base_url=pod.url, timeout=10) as pod_client:
            done = await _metric(pod_client, "vllm:request_success_total")
        assert done == 2


async def test_a_short_prompt_leaves_the_queue_before_a_long_one_sent_just_before_it(
    sim_pods, start_router
):
    (pod,) = sim_pods(1, *POD_FLAGS)
    for weight, first in ((1.0, "short"), (0.0, "long")):
        router = await start_router(_config([pod.url], prefill_time_weight=weight))
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            busy = await _occupy(client, pod.url, f"busy {weight}")
            first_byte: dict[str, float] = {}
            # ~30k prompt tokens (over a second of predicted prefill), then a short prompt
            # while the long one still waits.
            long = asyncio.create_task(
                _first_byte(client, f"{weight} " + "long words " * 15_000, "long", first_byte)
            )
            await _until(lambda: _queued(client, 1))
            short = asyncio.create_task(
                _first_byte(client, f"{weight} a short question", "short", first_byte)
            )
            await _until(lambda: _queued(client, 2))
            assert await asyncio.gather(long, short) == [200, 200]
            for task in busy:
                assert (await task)[0] == 200
            assert min(first_byte, key=lambda name: first_byte[name]) == first
        router.stop()


async def _first_byte(
    client: httpx.AsyncClient, text: str, name: str, first_byte: dict[str, float]
) -> int:
    """Stream a 4-token answer; `first_byte[name]` is when its first byte came."""
    async with client.stream("POST", "/v1/chat/completions", json=_body(text, 4)) as r:
        async for _chunk in r.aiter_bytes():
            first_byte.setdefault(name, asyncio.get_running_loop().time())
    return r.status_code


async def _queued(client: httpx.AsyncClient, n: int) -> bool:
    return await _metric(client, "kvgate_router_queued_requests") == n


async def _occupy(
    client: httpx.AsyncClient, pod_url: str, text: str, max_tokens: int = 200
) -> list[asyncio.Task[Any]]:
    """Two long answers through the router: one runs on the pod, one waits there (the pod is
    saturated). Returns their tasks."""
    busy = [
        asyncio.create_task(_stream(client, _body(f"{text} {i}", max_tokens), {})) for i in range(2)
    ]
    await _until(lambda: _engine_waiting(client, pod_url), within=15)
    return busy


async def _engine_waiting(client: httpx.AsyncClient, pod_url: str) -> bool:
    async with httpx.AsyncClient(base_url=pod_url, timeout=5) as pod_client:
        return await _metric(pod_client, "vllm:num_requests_waiting") >= 1


async def test_shutdown_answers_requests_still_queued_at_the_end_of_the_grace(
    sim_pods, tmp_path: Path
):
    (pod,) = sim_pods(1, *POD_FLAGS)
    grace = 1.5
    config = edge_router_config([pod.url], flow_control={"max_waiting_requests": 1})
    proc = EdgeRouterProcess(tmp_path, config, extra_args=("--shutdown-grace", str(grace)))
    proc.wait_ready()
    try:
        async with httpx.AsyncClient(base_url=proc.url, timeout=60) as client:
            busy = await _occupy(client, pod.url, "busy", max_tokens=400)
            queued = asyncio.create_task(_stream(client, _body("queued", 4), {}))
            await _until(lambda: _queued(client, 1))
            proc.terminate()
            status, headers, payload = await asyncio.wait_for(queued, grace + 10)
            await asyncio.wait_for(asyncio.gather(*busy, return_exceptions=True), grace + 10)
        assert await asyncio.to_thread(proc.proc.wait, grace + 10) == 0
    finally:
        proc.stop()
    # It never reached a pod: a 503 in the OpenAI shape, to be retried elsewhere.
    assert status == 503, payload
    assert httpx.Response(200, content=payload).json()["error"]["code"] == "shutting_down"
    assert headers["retry-after"] == "1"
