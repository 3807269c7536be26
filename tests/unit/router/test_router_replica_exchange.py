"""The exchanges with the other router replicas: one Redis client for both, and a loop that
nothing but `stop()` ends."""

from __future__ import annotations

import asyncio
import logging
from unittest.mock import AsyncMock

import httpx
import pytest
from tests.unit.router.fakes import FakePods, make_config, routing_core

from kvgate.api.router_config import RouterConfig
from kvgate.router.http import replica_exchange
from kvgate.router.http.load_sharing import LoadSharer
from kvgate.router.metrics import RouterMetrics
from kvgate.router.runtime import RouterRuntime


def _redis_config(url: str) -> RouterConfig:
    return make_config(2, directory={"backend": "redis", "redis": {"url": url}})


async def test_both_exchanges_use_one_client_made_anew_when_the_directorys_redis_changes():
    config = _redis_config("redis://shared.example:6379/0")
    runtime = RouterRuntime(config, transport=httpx.MockTransport(FakePods().handler))
    try:
        load, warm = runtime.load_sharer, runtime.warm_sharer
        first = await warm.redis.client(config.directory.redis)
        assert await load.redis.client(config.directory.redis) is first  # one pool, not two
        moved = _redis_config("redis://elsewhere.example:6379/0").directory.redis
        second = await load.redis.client(moved)  # a reload moved the directory
        assert second is not first and await warm.redis.client(moved) is second
    finally:
        await runtime.stop()
    assert runtime.replica_redis.current is None  # closed with the runtime


async def test_a_round_that_raises_is_logged_once_and_retried_never_the_end_of_the_task(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(replica_exchange, "MAX_BACKOFF_SECONDS", 0.01)
    config = _redis_config("redis://shared.example:6379/0")
    core, _ = await routing_core(config, [0.0], 2)
    reads = []

    def read_config() -> RouterConfig:  # a bug outside any Redis call, twice
        reads.append(1)
        if len(reads) <= 2:
            raise RuntimeError("bug")
        return config

    sharer = LoadSharer(core, read_config, RouterMetrics(), replica="a")
    bug = AsyncMock(side_effect=RuntimeError("another bug"))
    monkeypatch.setattr(sharer.redis, "client", bug)
    caplog.set_level(logging.INFO, logger=replica_exchange.__name__)
    sharer.start()
    try:
        for _ in range(200):
            if bug.await_count >= 3:
                break
            await asyncio.sleep(0.01)
        assert sharer._task is not None and not sharer._task.done()
        assert bug.await_count >= 3  # each round tried again, backing off
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is not None  # one traceback per run
    finally:
        await sharer.stop()
