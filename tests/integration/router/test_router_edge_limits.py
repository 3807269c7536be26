"""Connection limits of a real `kvgate router` process in front of a real simulated pod: header
bytes, header/body/idle deadlines, the connection cap and the open-files limit. Every wait is
bounded; a failure shows what the router answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from tests.integration.router.edge_helpers import (
    RawConnection,
    RouterProcess,
    request_bytes,
    router_config,
)

COMPLETION = b'{"model": "m", "prompt": "hello there", "max_tokens": 2}'
TIMEOUTS = {"header_timeout_seconds": 1.5, "body_timeout_seconds": 1.5, "idle_timeout_seconds": 1.0}


@pytest.fixture
def router(sim_pods, tmp_path: Path):
    started: list[RouterProcess] = []

    def start(server: dict | None = None, **kwargs) -> RouterProcess:
        pod = sim_pods(1)[0]
        proc = RouterProcess(tmp_path, router_config([pod.url], server=server or {}), **kwargs)
        started.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def _completion_ok(client: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    resp = await client.post("/v1/completions", content=COMPLETION)
    assert resp.status_code == 200, resp.text
    return time.perf_counter() - started


async def test_a_64_mb_header_is_refused_with_431_without_buffering_it(router):
    proc = router()
    peak_before = _rss_peak_kib(proc.proc.pid)
    conn = await RawConnection.open(proc.port)
    await conn.send(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nx-big: ")
    sent = 0
    chunk = b"a" * (1 << 20)
    started = time.monotonic()
    while sent < 64 * (1 << 20) and await conn.send(chunk):
        sent += len(chunk)
    response = await conn.response(within_seconds=10)
    conn.close()
    assert response.status == 431, response
    assert response.json()["error"]["code"] == "header_too_large"
    assert time.monotonic() - started < 10
    # The header was counted and dropped, never held: the peak RSS barely moved.
    assert _rss_peak_kib(proc.proc.pid) - peak_before < 32 * 1024
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
        await _completion_ok(client)
    assert proc.metric("kvgate_router_connections_closed_total", 'reason="header_too_large"') == 1


async def test_slowloris_connections_are_closed_while_requests_keep_working(router):
    proc = router(TIMEOUTS)
    count = 300

    async def slow_client() -> tuple[int | None, float]:
        conn = await RawConnection.open(proc.port)
        started = time.monotonic()
        await conn.send(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\n")

        async def trickle() -> None:
            for _ in range(100):  # one header byte every 0.1 s: never a complete head
                if not await conn.send(b"x"):
                    return
                await asyncio.sleep(0.1)

        dribbler = asyncio.create_task(trickle())
        try:
            response = await conn.response(within_seconds=8)
        finally:
            dribbler.cancel()
            conn.close()
        return response.status, time.monotonic() - started

    slow = [asyncio.create_task(slow_client()) for _ in range(count)]
    latencies = []
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # normal traffic while the slow clients hold on
            latencies.append(await _completion_ok(client))
            await asyncio.sleep(0.05)
    results = await asyncio.gather(*slow)
    assert [s for s, _ in results] == [408] * count
    assert max(t for _, t in results) < 1.5 + 2.0  # the header deadline, plus scheduling
    assert len(latencies) >= 5 and max(latencies) < 1.0, latencies
    assert proc.metric("kvgate_router_connections_closed_total", 'reason="header_timeout"') == count
    assert proc.error_lines() == []


async def test_idle_and_body_deadlines(router):
    proc = router(TIMEOUTS)
    fresh = await RawConnection.open(proc.port)
    assert await fresh.closed_by_peer(within_seconds=1.0 + 2.0)
    kept = await RawConnection.open(proc.port)
    await kept.send(request_bytes("GET", "/health", headers={"content-type": None}))
    assert (await kept.response()).status == 200
    assert await kept.closed_by_peer(within_seconds=1.0 + 2.0)  # keep-alive, then idle: closed
    slow_body = await RawConnection.open(proc.port)
    head = request_bytes("POST", "/v1/completions", COMPLETION)
    await slow_body.send(head[: -len(COMPLETION)] + COMPLETION[:10])
    started = time.monotonic()
    response = await slow_body.response(within_seconds=5)
    assert response.status == 408 and response.json()["error"]["code"] == "body_timeout"
    assert 1.0 < time.monotonic() - started < 1.5 + 2.0
    # A body sent in pieces within the deadline is fine.
    steady = await RawConnection.open(proc.port)
    await steady.send(head[: -len(COMPLETION)])
    for piece in (COMPLETION[:20], COMPLETION[20:40], COMPLETION[40:]):
        await asyncio.sleep(0.3)
        await steady.send(piece)
    assert (await steady.response()).status == 200
    for conn in (fresh, kept, slow_body, steady):
        conn.close()
    assert proc.error_lines() == []


async def test_over_the_connection_cap_a_new_client_gets_a_clean_503(router):
    proc = router({"max_connections": 3, "body_timeout_seconds": 20})
    head = request_bytes("POST", "/v1/completions", COMPLETION)[: -len(COMPLETION)]
    busy = []
    for _ in range(3):  # three clients in the middle of sending a body: not idle
        conn = await RawConnection.open(proc.port)
        await conn.send(head + COMPLETION[:5])
        busy.append(conn)
    await asyncio.sleep(0.2)
    extra = await RawConnection.open(proc.port)
    await extra.send(request_bytes("POST", "/v1/completions", COMPLETION))
    response = await extra.response(within_seconds=5)
    extra.close()
    assert response.status == 503, response
    assert response.headers["retry-after"] == "1" and response.headers["connection"] == "close"
    assert response.json()["error"]["code"] == "too_many_connections"
    for conn in busy:  # the busy clients finish their requests normally
        await conn.send(COMPLETION[5:])
        assert (await conn.response()).status == 200
        conn.close()
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
        await _completion_ok(client)
    assert proc.error_lines() == []


async def test_with_256_open_files_300_idle_connections_do_not_block_new_requests(router):
    proc = router(open_files=256)
    assert "lowered to 80" in proc.log_text()
    idle = []
    for i in range(300):  # half fresh, half kept alive after a request
        conn = await RawConnection.open(proc.port)
        if i % 2:
            await conn.send(request_bytes("GET", "/health", headers={"content-type": None}))
            response = await conn.response(within_seconds=5)
            assert response.status in (200, None), response  # None: evicted meanwhile
        idle.append(conn)
    statuses = []
    async with httpx.AsyncClient(base_url=proc.url, timeout=5) as client:
        for _ in range(20):
            resp = await client.post("/v1/completions", content=COMPLETION)
            statuses.append(resp.status_code)
    for conn in idle:
        conn.close()
    assert statuses == [200] * 20
    assert proc.metric("kvgate_router_connections_closed_total", 'reason="evicted_idle"') >= 200
    assert proc.metric("kvgate_router_open_connections") <= 80 + 1
    assert proc.error_lines() == []
