"""A real router answering browsers of other origins (CORS), as vLLM's --allowed-origins does,
only where `server.cors_allowed_origins` allows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import canned_pod, completion_answer, router_before_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ORIGIN = "https://chat.example"
ANSWER = completion_answer()


def _answer(body: dict[str, Any]) -> tuple[bytes, str]:
    return ANSWER, "application/json"


async def _browser(url: str) -> tuple[httpx.Response, httpx.Response]:
    """A page's preflight, then its request."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        preflight = await client.options(
            "/v1/completions",
            headers={
                "origin": ORIGIN,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type",
            },
        )
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        got = await client.post("/v1/completions", json=body, headers={"origin": ORIGIN})
    return preflight, got


async def test_an_allowed_origin_gets_its_preflight_and_the_headers_it_may_read(
    tmp_path: Path,
) -> None:
    server = {"cors_allowed_origins": [ORIGIN]}
    with router_before_pod(canned_pod(_answer), tmp_path, server=server) as (proc, _pod):
        preflight, got = await _browser(proc.url)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert got.status_code == 200 and got.headers["access-control-allow-origin"] == ORIGIN
    exposed = got.headers["access-control-expose-headers"].lower()
    assert "x-kvgate-decision" in exposed and "x-request-id" in exposed


async def test_without_allowed_origins_no_cors_header_is_sent(tmp_path: Path) -> None:
    with router_before_pod(canned_pod(_answer), tmp_path) as (proc, _pod):
        preflight, got = await _browser(proc.url)
    assert preflight.status_code == 404 or preflight.status_code == 405
    assert "access-control-allow-origin" not in got.headers
