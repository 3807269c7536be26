"""The reconciler against an in-memory API: children, drift, status, errors, finalizer."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
import yaml
from fake_kube import Events, FakeKube

from kvgate.api.base import GROUP_VERSION
from kvgate.api.router_config import parse_router_config
from kvgate.operator.kube import KubeError
from kvgate.operator.reconcile import OperatorSettings, Reconciler

Json = dict[str, Any]
NOW = "2026-01-01T00:00:00Z"


def pool(name: str = "llama", **spec: Any) -> Json:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default", "labels": {"family": "llama"}},
        "spec": {"model": "meta-llama/Llama-3.1-8B", "gpus": 0, **spec},
    }


def policy(name: str = "front", **spec: Any) -> Json:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "RoutingPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pools": ["llama"], **spec},
    }


def make(kube: FakeKube, events: Events, **kwargs: Any) -> Reconciler:
    settings = OperatorSettings(router_image="kvgate:test", cleanup_timeout_seconds=0.5)
    return Reconciler(kube, events, settings, clock=lambda: NOW, **kwargs)


def condition(status: Json, kind: str) -> Json:
    return next(c for c in status["conditions"] if c["type"] == kind)


async def test_pool_creates_children_and_status(kube: FakeKube, events: Events) -> None:
    body = kube.put(pool(replicas=2))
    status = await make(kube, events).reconcile_pool(body)
    assert kube.kinds() == ["Deployment", "InferencePool", "PodDisruptionBudget", "Service"]
    deployment = kube.find("Deployment", "llama")
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("InferencePool", body["metadata"]["uid"])
    assert status is not None
    assert status["selector"] == (
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=llama,"
        "app.kubernetes.io/name=kvgate,kvgate.io/pool=llama"
    )
    assert status["observedGeneration"] == 1
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoReadyEngines")
    assert condition(status, "Progressing")["status"] == "True"
    assert condition(status, "Degraded")["status"] == "False"
    assert kube.find("InferencePool", "llama")["status"]["replicas"] == 0  # type: ignore[index]
    assert events.posted == []


async def test_status_follows_the_deployment(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    body = kube.put(pool(replicas=2))
    await rec.reconcile_pool(body)
    deployment = kube.find("Deployment", "llama")
    assert deployment is not None
    deployment["status"] = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": 2,
        "readyReplicas": 1,
        "updatedReplicas": 2,
    }
    status = await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    assert status is not None
    assert (status["readyReplicas"], status["endpoints"]) == (1, 1)
    assert condition(status, "Ready")["reason"] == "PartiallyReady"
    deployment = kube.find("Deployment", "llama")
    assert deployment is not None
    deployment["status"]["readyReplicas"] = 2
    status = await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    assert status is not None
    assert condition(status, "Ready")["reason"] == "AllReplicasReady"
    assert condition(status, "Progressing")["status"] == "False"


async def test_unchanged_status_is_not_rewritten(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool())
    await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    patches = len(kube.status_patches)
    await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    assert len(kube.status_patches) == patches


async def test_deleted_or_edited_children_come_back(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool(replicas=3))
    await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    del kube.objects[("v1", "Service", "default", "llama")]
    deployment = kube.find("Deployment", "llama")
    assert deployment is not None
    deployment["spec"]["replicas"] = 7
    # A watch on the child hands the child to the reconciler, which finds the owner.
    await rec.reconcile_owner_of(deployment)
    assert kube.find("Service", "llama") is not None
    assert kube.find("Deployment", "llama")["spec"]["replicas"] == 3  # type: ignore[index]


async def test_children_of_foreign_owners_are_ignored(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    child = {
        "metadata": {
            "name": "x",
            "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x"}],
        }
    }
    await rec.reconcile_owner_of(child)
    assert kube.applied == []


async def test_a_child_name_another_resource_holds_is_not_taken_over(
    kube: FakeKube, events: Events
) -> None:
    """A pool `front-router` and a policy `front` both make a Deployment and a Service
    `front-router`: forced, each apply took the other's over (the router's Service then sent
    clients to the engines, past the router's API keys)."""
    rec = make(kube, events)
    kube.put(pool())
    engines = kube.put(pool("front-router"))
    await rec.reconcile_pool(engines, cascade=False)
    router = kube.put(policy())
    status = await rec.reconcile_policy(router)
    deployment = kube.find("Deployment", "front-router")
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "InferencePool"  # type: ignore[index]
    degraded = condition(status, "Degraded")  # type: ignore[arg-type]
    assert degraded["reason"] == "NameTaken" and "InferencePool front-router" in degraded["message"]
    assert status["replicas"] == 0  # type: ignore[index]  # not the pool's engine pods
    # the same resource made again (a new uid) takes its children over
    del kube.objects[(GROUP_VERSION, "InferencePool", "default", "front-router")]
    again = kube.put(pool("front-router"))
    assert (
        condition(await rec.reconcile_pool(again, cascade=False), "Degraded")["status"] == "False"
    )  # type: ignore[arg-type]
    owner = kube.find("Deployment", "front-router")["metadata"]["ownerReferences"][0]  # type: ignore[index]
    assert owner["uid"] == again["metadata"]["uid"]
    # an object of the same name that kvgate did not make is left alone; an orphan of its own
    # (its owner's reference dropped) is taken back
    mine = kube.put(pool("mine"))
    kube.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "mine"}, "spec": {}})
    status = await rec.reconcile_pool(mine, cascade=False)
    assert condition(status, "Degraded")["reason"] == "NameTaken"  # type: ignore[arg-type]
    assert "ownerReferences" not in kube.find("Service", "mine")["metadata"]  # type: ignore[index]
    del kube.objects[("v1", "Service", "default", "mine")]
    await rec.reconcile_pool(mine, cascade=False)
    del kube.find("Service", "mine")["metadata"]["ownerReferences"]  # type: ignore[index]
    status = await rec.reconcile_pool(mine, cascade=False)
    assert condition(status, "Degraded")["status"] == "False"  # type: ignore[arg-type]


async def test_invalid_spec_becomes_degraded_with_an_event(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    body = kube.put(pool(replicas=-1, engine={"blockSize": 12}))
    status = await rec.reconcile_pool(body)
    assert status is not None
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "replicas" in degraded["message"] and "greater than or equal to 0" in degraded["message"]
    assert condition(status, "Ready")["reason"] == "InvalidSpec"
    assert kube.applied == []
    assert events.reasons() == ["InvalidSpec"]
    # The same problem on the next resync posts no second event.
    await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    assert events.reasons() == ["InvalidSpec"]
    # Fixed: the pool reconciles and a Normal event says so.
    fixed = kube.put({**pool(), "metadata": kube.find("InferencePool", "llama")["metadata"]})  # type: ignore[index]
    status = await rec.reconcile_pool(fixed)
    assert status is not None and condition(status, "Degraded")["status"] == "False"
    assert events.reasons() == ["InvalidSpec", "Reconciled"]


async def test_api_errors_become_degraded_not_exceptions(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.fail_apply["Deployment"] = KubeError(403, 'deployments.apps is forbidden: User "x"')
    status = await rec.reconcile_pool(kube.put(pool()))
    assert status is not None
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "ApplyFailed"
    assert "cannot apply Deployment llama: deployments.apps is forbidden" in degraded["message"]
    assert events.posted[0][1:3] == ("Warning", "ApplyFailed")


async def test_api_server_down_does_not_raise(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    body = kube.put(pool())
    kube.fail_all = KubeError(0, "Cannot connect to host 127.0.0.1:6443")
    status = await rec.reconcile_pool(body)
    assert status is not None and condition(status, "Degraded")["reason"] == "ApplyFailed"
    status = await rec.reconcile_policy(kube.put(policy()))
    assert status is not None and condition(status, "Degraded")["status"] == "True"


async def test_deleting_pools_are_left_to_the_finalizer(kube: FakeKube, events: Events) -> None:
    body = pool()
    body["metadata"]["deletionTimestamp"] = NOW
    assert await make(kube, events).reconcile_pool(kube.put(body)) is None
    assert kube.applied == []


async def test_policy_renders_router_and_config(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool(servedModelName="llama-8b"))
    kube.find("InferencePool", "llama")["status"] = {"readyReplicas": 2}  # type: ignore[index]
    status = await rec.reconcile_policy(kube.put(policy()))
    assert status is not None
    assert status["pools"] == ["llama"] and status["endpoints"] == 2
    assert len(status["configHash"]) == 16
    for kind, name in [
        ("ServiceAccount", "front-router"),
        ("Role", "front-router"),
        ("RoleBinding", "front-router"),
        ("ConfigMap", "front-router-config"),
        ("Service", "front-router"),
        ("Deployment", "front-router"),
    ]:
        assert kube.find(kind, name) is not None, kind
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None
    config = parse_router_config(config_map["data"]["router.yaml"])
    assert [p.model for p in config.pools] == ["llama-8b"]
    assert config.pools[0].endpoints.kubernetes is not None
    assert config.pools[0].endpoints.kubernetes.service == "llama"
    deployment = kube.find("Deployment", "front-router")
    assert deployment is not None
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "kvgate:test"
    assert container["args"][-3:] == ["router", "--config", "/etc/kvgate/router.yaml"]
    assert condition(status, "Ready")["reason"] == "NoReadyRouters"


async def test_policy_config_follows_pool_changes(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool())
    kube.put(policy())
    await rec.reconcile_pool(kube.find("InferencePool", "llama"))  # type: ignore[arg-type]
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None
    assert "block_size" not in config_map["data"]["router.yaml"]
    deployment_before = kube.find("Deployment", "front-router")
    # The pool's block size changes: the cascade re-renders the router config in place.
    updated = kube.find("InferencePool", "llama")
    assert updated is not None
    updated["spec"]["engine"] = {"blockSize": 32}
    await rec.reconcile_pool(updated)
    config = yaml.safe_load(kube.find("ConfigMap", "front-router-config")["data"]["router.yaml"])  # type: ignore[index]
    assert config["pools"][0]["engine"]["block_size"] == 32
    # ...without touching the router's pod template (no restart: the router reloads the file).
    assert kube.find("Deployment", "front-router") == deployment_before


async def test_policy_with_missing_pools(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    status = await rec.reconcile_policy(kube.put(policy(pools=["nope"])))
    assert status is not None
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "NoPools"
    assert "InferencePool nope not found in namespace default" in degraded["message"]
    assert kube.find("Deployment", "front-router") is None
    kube.put(pool())
    status = await rec.reconcile_policy(kube.put(policy(pools=["llama", "nope"])))
    assert status is not None
    assert condition(status, "Degraded")["reason"] == "PoolsMissing"
    assert kube.find("Deployment", "front-router") is not None


async def test_policy_selects_pools_by_label(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool("a"))
    kube.put(pool("b"))
    other = pool("c")
    other["metadata"]["labels"] = {"family": "qwen"}
    kube.put(other)
    body = policy(pools=[], poolSelector={"matchLabels": {"family": "llama"}})
    status = await rec.reconcile_policy(kube.put(body))
    assert status is not None and status["pools"] == ["a", "b"]


async def test_policy_with_an_invalid_pool_skips_it(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool("llama"))
    kube.put(pool("broken", engine={"blockSize": 0}))
    status = await rec.reconcile_policy(kube.put(policy(pools=["llama", "broken"])))
    assert status is not None
    assert status["pools"] == ["llama"]
    assert "InferencePool broken is invalid" in condition(status, "Degraded")["message"]


async def test_finalizer_clears_the_redis_directory(kube: FakeKube, events: Events) -> None:
    calls: list[tuple[Any, str]] = []

    async def clear_pool(target: Any, pool_key: str, *, timeout_seconds: float) -> int:
        calls.append((target, pool_key))
        return 3

    rec = make(kube, events, clear_pool=clear_pool)
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "redis", "namespace": "default"},
            "data": {"password": "czNjcjN0"},  # "s3cr3t"
        }
    )
    redis = {
        "url": "redis://r:6379/0",
        "keyPrefix": "kv",
        "password": {"name": "redis", "key": "password"},
    }
    kube.put(policy("shared", directory={"backend": "redis", "redis": redis}))
    kube.put(policy("local"))  # memory backend: nothing to clear
    body = kube.put(pool())
    await rec.finalize_pool(body)
    assert len(calls) == 1
    target, pool_key = calls[0]
    assert (target.url, target.key_prefix, target.password) == ("redis://r:6379/0", "kv", "s3cr3t")
    assert pool_key == "default/llama"
    assert events.posted == [
        (
            "llama",
            "Normal",
            "DirectoryCleared",
            "cleared 3 pods of default/llama from the directory at redis://r:6379/0",
        )
    ]


async def test_finalizer_never_hangs_when_redis_is_down(kube: FakeKube, events: Events) -> None:
    from kvgate.operator.cleanup import clear_pool

    rec = make(kube, events)  # the real clear_pool, against a port where nothing listens
    kube.put(policy(directory={"backend": "redis", "redis": {"url": "redis://127.0.0.1:9/0"}}))
    body = kube.put(pool())
    await asyncio.wait_for(rec.finalize_pool(body), 5)
    assert events.reasons() == ["DirectoryCleanupFailed"]
    assert "could not clear directory entries of default/llama" in events.posted[0][3]
    assert rec._clear_pool is clear_pool


async def test_finalizer_reads_the_url_secret_and_ca_bundle_and_hides_the_password(
    kube: FakeKube, events: Events
) -> None:
    calls: list[Any] = []

    async def clear_pool(target: Any, pool_key: str, *, timeout_seconds: float) -> int:
        calls.append(target)
        return 1

    rec = make(kube, events, clear_pool=clear_pool)
    url = "rediss://kv:hunter2@managed.example:6380/0"
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "managed", "namespace": "default"},
            "data": {"url": base64.b64encode(url.encode()).decode()},
        }
    )
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "redis-ca", "namespace": "default"},
            "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n"},
        }
    )
    redis = {
        "urlSecret": {"name": "managed", "key": "url"},
        "cluster": True,
        "caBundle": {"configMap": "redis-ca", "key": "ca.crt"},
    }
    kube.put(policy("shared", directory={"backend": "redis", "redis": redis}))
    await rec.finalize_pool(kube.put(pool()))
    [target] = calls
    assert (target.url, target.cluster, target.ca_pem) == (
        url,
        True,
        "-----BEGIN CERTIFICATE-----\n",
    )
    assert events.reasons() == ["DirectoryCleared"]
    assert "rediss://kv:***@managed.example:6380/0" in events.posted[0][3]
    assert "hunter2" not in events.posted[0][3]


async def test_finalizer_reports_a_missing_password_secret(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    redis = {"url": "redis://r:6379/0", "password": {"name": "absent", "key": "password"}}
    kube.put(policy(directory={"backend": "redis", "redis": redis}))
    await rec.finalize_pool(kube.put(pool()))
    assert events.reasons() == ["DirectoryCleanupFailed"]
    assert "Secret absent has no key password" in events.posted[0][3]


async def test_concurrent_reconciles_of_one_object_are_serialised(
    kube: FakeKube, events: Events
) -> None:
    rec = make(kube, events)
    body = kube.put(pool())
    active = 0
    peak = 0
    original = kube.apply

    async def slow_apply(obj: Json) -> Json:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return await original(obj)

    kube.apply = slow_apply  # type: ignore[method-assign]
    await asyncio.gather(*(rec.reconcile_pool(body, cascade=False) for _ in range(4)))
    assert peak == 1


@pytest.mark.parametrize("kind", ["Deployment", "Service", "PodDisruptionBudget"])
async def test_every_pool_child_is_owned(kube: FakeKube, events: Events, kind: str) -> None:
    await make(kube, events).reconcile_pool(kube.put(pool()))
    child = kube.find(kind, "llama")
    assert child is not None
    assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvgate"
    assert child["metadata"]["ownerReferences"][0]["controller"] is True


async def test_external_indexer_is_run_and_parked(kube: FakeKube, events: Events) -> None:
    rec = make(kube, events)
    kube.put(pool())
    directory = {"backend": "redis", "embeddedIndexer": False}
    await rec.reconcile_policy(kube.put(policy(directory=directory)))
    indexer = kube.find("Deployment", "front-indexer")
    assert indexer is not None and indexer["spec"]["replicas"] == 1
    container = indexer["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][2:] == [
        "indexer",
        "--port",
        "8001",
        "--config",
        "/etc/kvgate/router.yaml",
    ]
    assert indexer["spec"]["template"]["spec"]["serviceAccountName"] == "front-router"
    # Back to routers indexing themselves: the indexer is scaled to zero, not left running.
    await rec.reconcile_policy(kube.put(policy(directory={"backend": "redis"})))
    assert kube.find("Deployment", "front-indexer")["spec"]["replicas"] == 0  # type: ignore[index]
    # A policy that never had one gets none.
    await rec.reconcile_policy(kube.put(policy("plain")))
    assert kube.find("Deployment", "plain-indexer") is None


async def test_replicas_that_would_not_share_load_get_one_warning(
    kube: FakeKube, events: Events
) -> None:
    rec = make(kube, events)
    kube.put(pool())
    body = kube.put(policy(router={"replicas": 3}))
    await rec.reconcile_policy(body)
    await rec.reconcile_policy(body)  # a resync: no second event
    assert events.reasons() == ["LoadNotShared"]
    assert "in memory" in events.posted[0][3]
    # The Redis directory shares load: nothing to say; turning sharing off is said again.
    redis = {"backend": "redis", "redis": {"url": "redis://r:6379/0"}}
    shared = kube.put(policy(router={"replicas": 3}, directory=redis))
    await rec.reconcile_policy(shared)
    off = kube.put(policy(router={"replicas": 3}, directory=redis, loadSharing={"enabled": False}))
    await rec.reconcile_policy(off)
    assert events.reasons() == ["LoadNotShared", "LoadNotShared"]
    assert "loadSharing.enabled is false" in events.posted[1][3]
    # One replica has no one to share with.
    await rec.reconcile_policy(kube.put(policy(name="solo")))
    assert events.reasons() == ["LoadNotShared", "LoadNotShared"]


async def test_a_policys_status_is_its_routers_not_its_indexers(
    kube: FakeKube, events: Events
) -> None:
    """The indexer's Deployment is applied after the router's: keyed by kind, it was the one
    the status read (a router at 3 of 3 ready showed as 1 of 1)."""
    rec = make(kube, events)
    kube.put(pool())
    spec = {"directory": {"backend": "redis", "embeddedIndexer": False}, "router": {"replicas": 3}}
    await rec.reconcile_policy(kube.put(policy(**spec)))
    for name, ready in (("front-router", 3), ("front-indexer", 1)):
        deployment = kube.find("Deployment", name)
        assert deployment is not None
        deployment["status"] = {"observedGeneration": deployment["metadata"]["generation"],
                                "replicas": ready, "readyReplicas": ready,
                                "updatedReplicas": ready}  # fmt: skip
    status = await rec.reconcile_policy(kube.find("RoutingPolicy", "front"))  # type: ignore[arg-type]
    assert status is not None and (status["replicas"], status["readyReplicas"]) == (3, 3)
