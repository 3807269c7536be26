"""The router app in process, in front of fake pods."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from tests.unit.router.fakes import FakePods

from kvgate.api.router_config import RouterConfig
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.app import RouterApp

AppFactory = Callable[..., Any]


@pytest.fixture
async def router_app() -> AsyncIterator[Callable[..., Any]]:
    """`await router_app(config, pods)` -> (httpx client to the app, runtime)."""
    opened: list[tuple[httpx.AsyncClient, RouterRuntime]] = []

    async def make(config: RouterConfig, pods: FakePods) -> tuple[httpx.AsyncClient, RouterRuntime]:
        runtime = RouterRuntime(config, transport=httpx.MockTransport(pods.handler))
        await runtime.start()
        await runtime.scraper.scrape_once()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=RouterApp(runtime)), base_url="http://router"
        )
        opened.append((client, runtime))
        return client, runtime

    yield make
    for client, runtime in opened:
        await client.aclose()
        await runtime.stop()
