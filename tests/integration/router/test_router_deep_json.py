"""JSON nested 100,000 levels deep where the router reads a pod's answers and its Redis: a real
`kvgate router` process, a real HTTP pod, a real redis-server. Python's parser gives up on such
JSON with `RecursionError`, which the router's parsers did not catch (they caught `ValueError`):
a non-stream answer became a 500 with a traceback, a stream was cut, `/admin/warm` failed, and
one such field in the replica load hash failed every load-sharing round. Now each reads as
malformed: the client gets the pod's bytes, the router learns nothing from them, logs no error."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from tests.integration.router.edge_helpers import (
    canned_pod,
    router_before_pod,
)

from kvgate.directory.replica_load import ReplicaLoadBoard

pytestmark = pytest.mark.timeout(120)

DEPTH = 100_000
DEEP = "[" * DEPTH + "]" * DEPTH  # valid JSON, too deep for Python's parser
ANSWER = (
    '{"id":"cmpl-1","object":"text_completion","model":"m",'
    '"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],'
    f'"usage":{DEEP}}}'
).encode()
STREAM = (
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":"hi"}]}\n\n'
    + f'data: {{"id":"cmpl-1","choices":[],"usage":{DEEP}}}\n\n'.encode()
    + b"data: [DONE]\n\n"
)
TOKEN = "s3cret"


def _answer(body: dict[str, Any]) -> tuple[bytes, str]:
    return (STREAM, "text/event-stream") if body.get("stream") else (ANSWER, "application/json")


_POD = canned_pod(_answer)


def test_a_pods_deeply_nested_usage_reaches_the_client_as_sent(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN)
    admin = {"token": {"file": str(token_file)}}
    with (
        router_before_pod(_POD, tmp_path, admin=admin) as (proc, _),
        httpx.Client(base_url=proc.url, timeout=10) as client,
    ):
        for _ in range(3):
            got = client.post("/v1/completions", json={"model": "m", "prompt": "hello"})
            assert got.status_code == 200
            assert got.content == ANSWER
        for include_usage in (False, True):  # the router asks for usage when the client did not
            body: dict[str, Any] = {"model": "m", "prompt": "hello", "stream": True}
            if include_usage:
                body["stream_options"] = {"include_usage": True}
            got = client.post("/v1/completions", json=body)
            assert got.status_code == 200
            assert got.content == STREAM
        warmed = client.post(
            "/admin/warm",
            json={"model": "m", "prompt": "hello"},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert warmed.status_code == 200, warmed.text
        [result] = warmed.json()["results"]
        assert (result["status"], result["prompt_tokens"]) == (200, None)
    assert not proc.error_lines(), proc.log_text()[-3000:]


async def test_load_sharing_reads_past_a_deeply_nested_replica_field(
    tmp_path: Path, redis_url: str
) -> None:
    overrides: dict[str, Any] = {
        "directory": {"backend": "redis", "redis": {"url": redis_url}},
        "load_sharing": {"interval_seconds": 0.05, "ttl_seconds": 60.0},
    }
    redis = aioredis.Redis.from_url(redis_url)
    try:
        with router_before_pod(_POD, tmp_path, **overrides) as (proc, pod):
            board = ReplicaLoadBoard(redis, "default/p")
            await board.exchange("peer", {pod: (3, 0, 0, 0)}, ttl_seconds=60.0, max_replicas=8)
            seconds, micros = await redis.time()
            stamp = str(seconds * 1000 + micros // 1000).encode()
            await redis.hset(board.key, "deep", stamp + b"|" + b"[" * 500_000)
            deadline = time.monotonic() + 10
            while proc.metric("kvgate_router_load_sharing_peers") != 1:
                assert time.monotonic() < deadline, proc.log_text()[-3000:]
                await asyncio.sleep(0.05)
            assert proc.metric("kvgate_router_load_sharing_degraded") == 0
    finally:
        await redis.aclose()
    assert not proc.error_lines(), proc.log_text()[-3000:]
