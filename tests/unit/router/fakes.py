"""Fake pods behind httpx.MockTransport, a config for them, and a routing core on a clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from kvgate.api.router_config import RouterConfig
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.discovery.endpoints import Endpoint, EndpointSet, EndpointSpec
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.metrics import RouterMetrics
from kvgate.router.runtime import build_state


def _resp(status: int, data: bytes, content_type: str = "application/json") -> httpx.Response:
    # A real stream (not pre-read content), as a network transport would give.
    return httpx.Response(
        status, headers={"content-type": content_type}, stream=httpx.ByteStream(data)
    )


@dataclass
class FakePods:
    """Pods answering completions (non-streaming JSON or SSE) and /metrics; records requests."""

    fail: set[str] = field(default_factory=set)  # hosts that refuse connections
    status: dict[str, int] = field(default_factory=dict)  # host -> forced HTTP status
    waiting: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # of the POSTs, in order
    cached_tokens: int = 3
    error_body_bytes: int = 0  # a forced status's body is this long (0: a short JSON error)
    error_bytes_read: int = 0  # how much of such bodies the router read
    retry_after: str | None = None  # a forced status's `retry-after` header
    error_message: str = "boom"  # a forced status's error message

    def _error_body(self) -> httpx.AsyncByteStream:
        pods = self

        class Counted(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                for _ in range(0, pods.error_body_bytes, 1 << 16):
                    pods.error_bytes_read += 1 << 16
                    yield b" " * (1 << 16)

        return Counted()

    def handler(self, request: httpx.Request) -> httpx.Response:
        response = self._answer(request)
        if "x-request-id" in request.headers:  # as vLLM --enable-request-id-headers does
            response.headers["x-request-id"] = request.headers["x-request-id"]
        return response

    def _answer(self, request: httpx.Request) -> httpx.Response:
        host = request.url.netloc.decode()
        if host in self.fail:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            text = (
                "# HELP vllm:num_requests_waiting x\n"
                f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting.get(host, 0)}\n'
                'vllm:num_requests_running{model_name="m"} 1.0\n'
                'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
            )
            return _resp(200, text.encode(), "text/plain")
        body = json.loads(request.content)
        self.requests.append((host, body))
        self.paths.append(request.url.path)
        if host in self.status:
            if self.error_body_bytes:
                return httpx.Response(self.status[host], stream=self._error_body())
            error = _resp(
                self.status[host], json.dumps({"error": {"message": self.error_message}}).encode()
            )
            if self.retry_after is not None:
                error.headers["retry-after"] = self.retry_after
            return error
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if body.get("stream"):
            events = [
                {"id": "1", "choices": [{"index": 0, "delta": {"content": "hi"}}]},
                {"id": "1", "choices": [{"index": 0, "delta": {"content": "!"}}]},
            ]
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append({"id": "1", "choices": [], "usage": usage})
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return _resp(200, text.encode(), "text/event-stream")
        answer = {"id": "1", "object": "chat.completion", "choices": [], "usage": usage}
        return _resp(200, json.dumps(answer).encode())


def make_config(n: int = 2, **overrides: Any) -> RouterConfig:
    data: dict[str, Any] = {
        "pools": [
            {
                "name": "p",
                "model": "m",
                "endpoints": {
                    "static": [{"url": f"http://pod{i}:8000"} for i in range(n)],
                },
            }
        ],
        "policy": {"seed": 1},
    }
    data.update(overrides)
    return RouterConfig.model_validate(data)


async def routing_core(
    config: RouterConfig, now: list[float], pods: int
) -> tuple[RoutingCore, EndpointSet]:
    """A core on the clock `now[0]`, told of endpoint changes, with the first pool's pods
    replaced by pod0..pod{pods-1}."""
    endpoints = EndpointSet(lambda: now[0])
    pool = config.pools[0]
    core = RoutingCore(
        build_state(config),
        endpoints,
        {pool.key: MemoryBlockIndex()},
        RouterMetrics(),
        DirectoryMetrics(CollectorRegistry()).fallback_errors,
        clock=lambda: now[0],
    )

    async def changed(added: list[Endpoint], removed: list[Endpoint]) -> None:
        core.endpoints_changed(added, removed)

    endpoints.add_listener(changed)
    specs = [EndpointSpec(f"pod{i}:8000", pool.key, f"http://pod{i}:8000") for i in range(pods)]
    await endpoints.replace_pool(pool.key, specs)
    return core, endpoints


async def static_core(config: RouterConfig, now: list[float]) -> RoutingCore:
    """A core on the clock `now[0]` over the static endpoints of every pool of `config`."""
    endpoints = EndpointSet(lambda: now[0])
    core = RoutingCore(
        build_state(config),
        endpoints,
        {pool.key: MemoryBlockIndex() for pool in config.pools},
        RouterMetrics(),
        DirectoryMetrics(CollectorRegistry()).fallback_errors,
        clock=lambda: now[0],
    )
    for pool in config.pools:
        urls = [e.url for e in pool.endpoints.static]
        specs = [EndpointSpec(url.removeprefix("http://"), pool.key, url) for url in urls]
        await endpoints.replace_pool(pool.key, specs)
    core.endpoints_changed(endpoints.all(), [])
    return core
