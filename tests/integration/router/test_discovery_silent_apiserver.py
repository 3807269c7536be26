"""Kubernetes discovery against an API server that goes silent mid-watch without closing the
connection (its node died, a partition): the client's own timeouts end the watch, the slices
are listed again, and a pod that left meanwhile leaves the pool. Real HTTP, a scripted API
server (aiohttp); a real kube-apiserver is exercised by the e2e suite."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config

from kvgate.api.router_config import RouterConfig
from kvgate.discovery import kubernetes
from kvgate.discovery.endpoints import EndpointSet
from kvgate.discovery.kubernetes import EndpointSliceDiscovery


def _slice_list(pods: list[str]) -> dict[str, Any]:
    endpoints = [
        {
            "addresses": [f"10.0.0.{i + 1}"],
            "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "default", "uid": pod},
        }
        for i, pod in enumerate(pods)
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSliceList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            {
                "metadata": {"name": "s1", "namespace": "default"},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "http", "port": 8000}],
            }
        ],
    }


async def test_a_silent_watch_is_ended_and_the_slices_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes, "WATCH_SECONDS", 30, raising=False)  # never ends it
    monkeypatch.setattr(kubernetes, "REQUEST_TIMEOUT", (1.0, 1.0), raising=False)
    state: dict[str, Any] = {"pods": ["vllm-a", "vllm-b"], "lists": 0, "watches": 0}
    done = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("true", "True", "1"):
            state["watches"] += 1
            response = web.StreamResponse()
            response.content_type = "application/json"
            await response.prepare(request)
            await done.wait()  # headers sent, then nothing, and no close
            return response
        state["lists"] += 1
        return web.json_response(_slice_list(state["pods"]))

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    # read at its import: set where an earlier test imported the client already
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    previous = Configuration.get_default_copy()  # loading the kubeconfig replaces it
    config = RouterConfig.model_validate(
        {"pools": [{"name": "p", "model": "m", "endpoints": {"kubernetes": {"service": "vllm"}}}]}
    )
    endpoints = EndpointSet()
    discovery = EndpointSliceDiscovery(config.pools[0], endpoints)
    await discovery.start()
    try:
        for _ in range(100):
            if state["watches"]:
                break
            await asyncio.sleep(0.05)
        assert sorted(ep.id for ep in endpoints.all()) == ["default/vllm-a", "default/vllm-b"]
        state["pods"] = ["vllm-b"]  # vllm-a leaves; the silent watch cannot tell
        for _ in range(100):
            if [ep.id for ep in endpoints.all()] == ["default/vllm-b"]:
                break
            await asyncio.sleep(0.05)
        assert [ep.id for ep in endpoints.all()] == ["default/vllm-b"]
        assert state["lists"] >= 2 and state["watches"] >= 1
    finally:
        await discovery.stop()
        done.set()
        await runner.cleanup()
        Configuration.set_default(previous)
