"""ApiKube speaks the API server's HTTP dialect: paths, verbs, content types, errors.

The server is an in-process aiohttp app on loopback that records requests and answers like the
API server (Status objects on errors), so kubernetes_asyncio's real client code path runs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from kvgate.operator.kube import ApiKube, KubeError, KubeEvents, resource_path

Json = dict[str, Any]


class ApiServer:
    def __init__(self) -> None:
        self.requests: list[Json] = []
        self.objects: dict[str, Json] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "auth": request.headers.get("Authorization"),
                "body": json.loads(body) if body else None,
            }
        )
        if request.method == "POST" and request.path.endswith("/events"):
            if request.path.startswith("/api/v1/namespaces/locked/"):
                return web.json_response({"kind": "Status", "message": "forbidden"}, status=403)
            return web.json_response(json.loads(body), status=201)
        if request.method == "PATCH" and request.path.endswith("/forbidden"):
            status = {
                "kind": "Status",
                "message": 'configmaps "forbidden" is forbidden',
                "code": 403,
            }
            return web.json_response(status, status=403)
        if request.method == "PATCH" and not request.path.endswith("/status"):
            self.objects[request.path] = json.loads(body)
            return web.json_response(json.loads(body))
        if request.method == "PATCH":
            if request.path.removesuffix("/status") not in self.objects:
                return web.json_response({"kind": "Status", "message": "not found"}, status=404)
            return web.json_response({})
        if request.path in self.objects:
            return web.json_response(self.objects[request.path])
        if request.path.endswith("/deployments"):
            items = [o for p, o in self.objects.items() if "/deployments/" in p]
            return web.json_response({"kind": "DeploymentList", "items": items})
        return web.json_response(
            {"kind": "Status", "message": "not found", "code": 404}, status=404
        )


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServer, ApiKube]]:
    server = ApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    config = client.Configuration(host=str(test_server.make_url("")).rstrip("/"))
    config.api_key = {"BearerToken": "t0ken"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    api_client = client.ApiClient(configuration=config)
    try:
        yield server, ApiKube(api_client, request_timeout_seconds=5)
    finally:
        await api_client.close()
        await test_server.close()


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llama", "namespace": "ai"},
    "spec": {"replicas": 2},
}


async def test_apply_is_a_forced_server_side_apply(api: tuple[ApiServer, ApiKube]) -> None:
    server, kube = api
    result = await kube.apply(DEPLOYMENT)
    assert result["spec"] == {"replicas": 2}
    request = server.requests[-1]
    assert request["method"] == "PATCH"
    assert request["path"] == "/apis/apps/v1/namespaces/ai/deployments/llama"
    assert request["query"] == {"fieldManager": "kvgate-operator", "force": "true"}
    assert request["content_type"] == "application/apply-patch+yaml"
    assert request["auth"] == "Bearer t0ken"
    assert request["body"] == DEPLOYMENT


async def test_get_list_and_missing(api: tuple[ApiServer, ApiKube]) -> None:
    _, kube = api
    assert await kube.get("apps/v1", "Deployment", "ai", "llama") is None
    await kube.apply(DEPLOYMENT)
    found = await kube.get("apps/v1", "Deployment", "ai", "llama")
    assert found is not None and found["metadata"]["name"] == "llama"
    items = await kube.list("apps/v1", "Deployment", "ai", label_selector="a=b")
    assert [i["kind"] for i in items] == ["Deployment"]


async def test_status_is_a_merge_patch_of_the_subresource(api: tuple[ApiServer, ApiKube]) -> None:
    server, kube = api
    await kube.patch_status("kvgate.io/v1alpha1", "InferencePool", "ai", "gone", {"replicas": 1})
    await kube.apply({**DEPLOYMENT, "apiVersion": "kvgate.io/v1alpha1", "kind": "InferencePool"})
    await kube.patch_status("kvgate.io/v1alpha1", "InferencePool", "ai", "llama", {"replicas": 1})
    request = server.requests[-1]
    assert request["path"] == "/apis/kvgate.io/v1alpha1/namespaces/ai/inferencepools/llama/status"
    assert request["content_type"] == "application/merge-patch+json"
    assert request["body"] == {"status": {"replicas": 1}}


async def test_errors_carry_the_api_servers_message(api: tuple[ApiServer, ApiKube]) -> None:
    _, kube = api
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "forbidden", "namespace": "ai"},
    }
    with pytest.raises(KubeError) as caught:
        await kube.apply(bad)
    assert caught.value.status == 403
    assert caught.value.message == 'configmaps "forbidden" is forbidden'


async def test_unreachable_server_is_a_kube_error() -> None:
    config = client.Configuration(host="http://127.0.0.1:9")
    api_client = client.ApiClient(configuration=config)
    try:
        with pytest.raises(KubeError) as caught:
            await ApiKube(api_client, request_timeout_seconds=2).get("v1", "Pod", "ai", "x")
        assert caught.value.status == 0
    finally:
        await api_client.close()


def test_resource_paths() -> None:
    assert resource_path("v1", "Service", "ns", "s") == "/api/v1/namespaces/ns/services/s"
    assert resource_path("policy/v1", "PodDisruptionBudget", "ns") == (
        "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
    )
    with pytest.raises(KubeError, match="does not know"):
        resource_path("v1", "Unicorn", "ns")


POOL = {
    "apiVersion": "kvgate.io/v1alpha1",
    "kind": "InferencePool",
    "metadata": {"name": "llama", "namespace": "ai", "uid": "u-1"},
}


async def test_events_are_posted_about_the_object(api: tuple[ApiServer, ApiKube]) -> None:
    server, kube = api
    await KubeEvents(kube)(POOL, type="Warning", reason="InvalidSpec", message="x" * 2000)
    request = server.requests[-1]
    assert (request["method"], request["path"]) == ("POST", "/api/v1/namespaces/ai/events")
    event = request["body"]
    assert event["involvedObject"] == {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "InferencePool",
        "name": "llama",
        "namespace": "ai",
        "uid": "u-1",
    }
    assert (event["type"], event["reason"], len(event["message"])) == (
        "Warning",
        "InvalidSpec",
        1024,
    )
    assert event["metadata"] == {"generateName": "llama.", "namespace": "ai"}
    assert event["source"] == {"component": "kvgate-operator"}


async def test_a_failed_event_is_logged_not_raised(
    api: tuple[ApiServer, ApiKube], caplog: pytest.LogCaptureFixture
) -> None:
    _, kube = api
    locked = {**POOL, "metadata": {**POOL["metadata"], "namespace": "locked"}}
    await KubeEvents(kube)(locked, type="Normal", reason="Reconciled", message="ok")
    assert "cannot post event Reconciled ok: forbidden" in caplog.text
