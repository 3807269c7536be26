"""Classes and borrowing, admin warm, config-file reload: behaviour through the app."""

import asyncio

import httpx
import yaml
from tests.unit.router.fakes import FakePods

from kvgate.api.router_config import RouterConfig
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.app import RouterApp

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]}


def _two_pools(**extra):
    return RouterConfig.model_validate(
        {
            "pools": [
                {"name": "on", "model": "m", "endpoints": {"static": [{"url": "http://on0:1"}]}},
                {
                    "name": "off",
                    "model": "m",
                    "pool_class": "batch",
                    "endpoints": {"static": [{"url": "http://off0:1"}]},
                },
            ],
            "policy": {"name": "least-load"},
            **extra,
        }
    )


async def test_batch_borrows_an_online_pod_only_while_it_has_room(router_app):
    pods = FakePods()
    client, runtime = await router_app(_two_pools(), pods)
    batch = {"x-kvgate-class": "batch"}
    online = await client.post("/v1/chat/completions", json=CHAT)
    assert online.headers["x-kvgate-pool"] == "default/on"
    # Keep the batch pod busier than the idle online pod: batch borrows it.
    busy = [
        runtime.core.accounting.sent(
            "off0:1", 0.0, uncached_tokens=0, predicted_ttft_seconds=0.0, streaming=True
        )
        for _ in range(50)
    ]
    resp = await client.post("/v1/chat/completions", json=CHAT, headers=batch)
    assert resp.headers["x-kvgate-endpoint"] == "on0:1"
    for attempt in busy:  # decoding now: the batch pod is busy but not saturated
        runtime.core.accounting.prefill_done(attempt)
    # The online pod starts queueing: no more borrowing, online traffic keeps it.
    pods.waiting["on0:1"] = 3
    await runtime.scraper.scrape_once()
    for _ in range(3):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=batch)
        assert resp.headers["x-kvgate-endpoint"] == "off0:1"
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.headers["x-kvgate-endpoint"] == "on0:1"


async def test_admin_warm_needs_the_token_and_sends_one_token_requests(router_app, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    pods = FakePods()
    config = _two_pools(admin={"token": {"file": str(token)}})
    client, _ = await router_app(config, pods)
    assert (await client.post("/admin/warm", json=CHAT)).status_code == 401
    bad = {"authorization": "Bearer nope"}
    assert (await client.post("/admin/warm", json=CHAT, headers=bad)).status_code == 401
    good = {"authorization": "Bearer s3cret"}
    resp = await client.post("/admin/warm", json={**CHAT, "targets": "all"}, headers=good)
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["endpoint"] for r in results] == ["on0:1"]
    assert results[0]["cached_tokens"] == 3
    sent = pods.requests[-1][1]
    assert sent["max_tokens"] == 1 and sent["stream"] is False and "targets" not in sent


async def test_admin_warm_records_history_only_where_the_prefix_was_computed(router_app, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    data = _two_pools(admin={"token": {"file": str(token)}}).model_dump(mode="json")
    data["pools"][0]["endpoints"]["static"].append({"url": "http://on1:1"})
    config = RouterConfig.model_validate(data)
    client, runtime = await router_app(config, FakePods(status={"on1:1": 500}))
    good = {"authorization": "Bearer s3cret"}
    resp = await client.post("/admin/warm", json={**CHAT, "targets": "all"}, headers=good)
    statuses = {r["endpoint"]: r["status"] for r in resp.json()["results"]}
    assert statuses == {"on0:1": 200, "on1:1": 500}
    plan = await runtime.core.explain(ClientRequest(CHAT, {}, "chat"))
    held = await runtime.core.learner.indexes["default/on"].lookup(plan.keys.block_keys)
    assert set(held) == {"on0:1"}  # the pod that failed holds nothing of it


async def test_admin_api_is_off_without_a_token(router_app):
    client, _ = await router_app(_two_pools(), FakePods())
    assert (await client.post("/admin/warm", json=CHAT)).status_code == 404


async def test_config_file_changes_are_reloaded(tmp_path):
    path = tmp_path / "router.yaml"
    data = _two_pools().model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data))
    pods = FakePods()
    runtime = RouterRuntime(
        RouterConfig.model_validate(data),
        config_path=str(path),
        transport=httpx.MockTransport(pods.handler),
        reload_check_seconds=0.02,
    )
    await runtime.start()
    try:
        data["policy"]["name"] = "round-robin"
        data["pools"][0]["endpoints"]["static"].append({"url": "http://on1:1"})
        path.write_text(yaml.safe_dump(data))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if runtime.core.state.policy.name == "round-robin":
                break
        assert runtime.core.state.policy.name == "round-robin"
        assert {ep.id for ep in runtime.endpoints.in_pool("default/on")} == {"on0:1", "on1:1"}
        path.write_text("pools: not-a-list\n")  # a broken file keeps the running config
        await asyncio.sleep(0.2)
        assert runtime.core.state.policy.name == "round-robin"
        assert runtime.metrics.config_reloads.labels("error")._value.get() >= 1
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=RouterApp(runtime)), base_url="http://r"
        )
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await client.aclose()
    finally:
        await runtime.stop()
