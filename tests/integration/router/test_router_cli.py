"""`kvgate router` as a user runs it: quick-start flags, a real process, a clean shutdown."""

from __future__ import annotations

import asyncio
import signal
import sys

import httpx
from tests.integration.conftest import free_port


async def test_quick_start_routes_and_shuts_down_cleanly(sim_pods, tmp_path):
    pods = sim_pods(2)
    port = free_port()
    log = (tmp_path / "router.log").open("wb")
    args = [sys.executable, "-m", "kvgate.cli", "router", "--model", "m", "--host", "127.0.0.1",
            "--port", str(port), "--policy", "kvgate"]  # fmt: skip
    for pod in pods:
        args += ["--endpoint", pod.url]
    proc = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(300):
                try:
                    if (await client.get("/ready")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-kvgate-endpoint"] in {p.url.split("//")[1] for p in pods}
            models = (await client.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["m"]
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
    assert "Traceback" not in (tmp_path / "router.log").read_text()
