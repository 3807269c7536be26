"""A real router in front of a real HTTP pod that, as vLLM does, sends a whole (non-stream)
answer's head only once the answer is generated: a long answer is no pod failure."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import canned_pod, completion_answer, router_before_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ANSWER = completion_answer(text="a long answer", completion_tokens=600)


async def test_a_whole_answer_longer_than_the_first_byte_timeout_is_waited_for_once(
    tmp_path: Path,
) -> None:
    """Its head comes once all of it is generated. Waited for only `first_byte_timeout`, it
    ran on every pod in turn (each computing it again), ended in a 504, and each attempt
    counted as a pod failure: three such answers ejected every healthy pod."""
    asked: list[float] = []
    lock = threading.Lock()

    def answer(body: dict[str, Any]) -> tuple[bytes, str]:
        with lock:
            asked.append(time.monotonic())
        time.sleep(1.5)  # the generation: longer than the first-byte timeout below
        return ANSWER, "application/json"

    limits = {"first_byte_timeout_seconds": 0.5, "max_answer_seconds": 10}
    with router_before_pod(canned_pod(answer), tmp_path, limits=limits) as (proc, _pod):
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
            for _ in range(3):
                body = {"model": "m", "prompt": "hello", "max_tokens": 600}
                got = await client.post("/v1/completions", json=body)
                assert got.status_code == 200, got.text
                assert got.json()["usage"]["completion_tokens"] == 600
            ready = (await client.get("/ready")).json()
    assert len(asked) == 3  # once each, never retried
    assert ready["ready"] is True, ready
