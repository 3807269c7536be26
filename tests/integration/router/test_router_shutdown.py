"""SIGTERM drains a real `kvgate router` process: short requests finish, long ones are ended in
the OpenAI shape at the end of the grace, and the process exits in time. Clients that leave
mid-request are the clients' doing: no ERROR line in the router's log."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
from tests.integration.router.edge_helpers import (
    RawConnection,
    RouterProcess,
    request_bytes,
    router_config,
)

GRACE_SECONDS = 2.0
# 20 wall seconds per simulated second: a decode step of the default profile takes ~0.1 s.
SLOW_POD = ("--sim-time-scale", "20")


def _chat(max_tokens: int, stream: bool) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _read_stream(client: httpx.AsyncClient, body: dict, started: asyncio.Event) -> bytes:
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        chunks = []
        async for chunk in resp.aiter_bytes():
            chunks.append(chunk)
            started.set()
        return b"".join(chunks)


async def test_sigterm_drains_then_ends_streams_with_an_error_event(sim_pods, tmp_path: Path):
    pod = sim_pods(1, *SLOW_POD)[0]
    proc = RouterProcess(
        tmp_path, router_config([pod.url]), extra_args=("--shutdown-grace", str(GRACE_SECONDS))
    )
    proc.wait_ready()
    try:
        async with httpx.AsyncClient(base_url=proc.url, timeout=60) as client:
            long_started, short_started = asyncio.Event(), asyncio.Event()
            long_stream = asyncio.create_task(_read_stream(client, _chat(400, True), long_started))
            short_stream = asyncio.create_task(_read_stream(client, _chat(4, True), short_started))
            long_plain = asyncio.create_task(
                client.post("/v1/chat/completions", json=_chat(400, False))
            )
            await asyncio.wait_for(asyncio.gather(long_started.wait(), short_started.wait()), 30)
            signalled = time.monotonic()
            proc.terminate()
            short, long, plain = await asyncio.wait_for(
                asyncio.gather(short_stream, long_stream, long_plain), GRACE_SECONDS + 10
            )
            ended_at = time.monotonic() - signalled
        exit_code = await asyncio.to_thread(proc.proc.wait, GRACE_SECONDS + 10)
        exited_at = time.monotonic() - signalled
    finally:
        proc.stop()
    # The short stream finished normally during the grace.
    assert short.rstrip().endswith(b"data: [DONE]")
    # The long stream was cut at the end of the grace, with an OpenAI error event last.
    events = [e for e in long.split(b"\n\n") if e.strip()]
    assert len(events) > 3 and b"[DONE]" not in long
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "shutting_down"
    assert last["error"]["type"] == "service_unavailable"
    # The non-streaming request had no response head yet: a 503 in the OpenAI shape.
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "shutting_down"
    assert GRACE_SECONDS - 0.2 < ended_at < GRACE_SECONDS + 3
    assert exit_code == 0 and exited_at < GRACE_SECONDS + 5
    assert proc.error_lines() == [], proc.log_text()


async def test_clients_leaving_mid_request_log_no_errors(sim_pods, tmp_path: Path):
    pod = sim_pods(1, *SLOW_POD)[0]
    proc = RouterProcess(tmp_path, router_config([pod.url]))
    proc.wait_ready()
    try:
        body = json.dumps(_chat(3, False)).encode()
        head = request_bytes("POST", "/v1/chat/completions", body)[: -len(body)]
        leaving = 200
        for _ in range(leaving):  # headers and half the body, then gone
            conn = await RawConnection.open(proc.port)
            await conn.send(head + body[: len(body) // 2])
            conn.close()
        for _ in range(10):  # mid-stream, after the first event
            conn = await RawConnection.open(proc.port)
            streamed = json.dumps(_chat(200, True)).encode()
            await conn.send(request_bytes("POST", "/v1/chat/completions", streamed))
            assert (await conn.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await conn.reader.readuntil(b"\n\n")
            conn.close()
        metric = "kvgate_router_client_disconnects_total"
        for _ in range(100):
            if proc.metric(metric, 'stage="body"') >= leaving:
                break
            await asyncio.sleep(0.05)
        assert proc.metric(metric, 'stage="body"') == leaving
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
            resp = await client.post("/v1/chat/completions", json=_chat(2, False))
            assert resp.status_code == 200
    finally:
        proc.stop()
    assert proc.error_lines() == [], proc.log_text()[-3000:]
