"""A policy whose router needs an absent Secret, Secret key or tokenizer ConfigMap says so."""

from __future__ import annotations

from typing import Any

from fake_kube import Events, FakeKube

from kvgate.api.base import GROUP_VERSION
from kvgate.operator.kube import KubeError
from kvgate.operator.reconcile import OperatorSettings, Reconciler

Json = dict[str, Any]
TENANTS = {
    "saltSecret": {"name": "tenants", "key": "salt"},
    "items": [{"name": "team-a", "apiKeys": [{"name": "tenants", "key": "team-a-key"}]}],
}


def reconciler(kube: FakeKube, events: Events) -> Reconciler:
    settings = OperatorSettings(router_image="kvgate:test")
    return Reconciler(kube, events, settings, clock=lambda: "2026-01-01T00:00:00Z")


def put_pool(kube: FakeKube, **spec: Any) -> None:
    kube.put(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "InferencePool",
            "metadata": {"name": "llama", "namespace": "default"},
            "spec": {"model": "m", "gpus": 0, **spec},
            "status": {"readyReplicas": 1},
        }
    )


def put_policy(kube: FakeKube, **spec: Any) -> Json:
    return kube.put(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "RoutingPolicy",
            "metadata": {"name": "front", "namespace": "default"},
            "spec": {"pools": ["llama"], **spec},
        }
    )


def put_secret(kube: FakeKube, name: str, **data: str) -> None:
    kube.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": dict(data)})


def degraded(status: Json | None) -> Json:
    assert status is not None
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


async def test_a_missing_secret_is_named(kube: FakeKube, events: Events) -> None:
    put_pool(kube)
    status = await reconciler(kube, events).reconcile_policy(put_policy(kube, tenants=TENANTS))
    condition = degraded(status)
    assert (condition["status"], condition["reason"]) == ("True", "SecretMissing")
    assert "Secret tenants not found in namespace default" in condition["message"]
    assert status is not None and status["reason"] == "SecretMissing"
    assert events.reasons() == ["SecretMissing"]
    # The router is rendered all the same: its pods start once the Secret exists.
    assert kube.find("Deployment", "front-router") is not None


async def test_a_missing_key_is_named_and_a_complete_secret_clears_it(
    kube: FakeKube, events: Events
) -> None:
    rec = reconciler(kube, events)
    put_pool(kube)
    put_secret(kube, "tenants", salt="c2FsdA==")
    body = put_policy(kube, tenants=TENANTS)
    condition = degraded(await rec.reconcile_policy(body))
    assert condition["reason"] == "SecretMissing"
    assert "Secret tenants has no key team-a-key" in condition["message"]
    put_secret(kube, "tenants", salt="c2FsdA==", **{"team-a-key": "c2stYQ=="})
    condition = degraded(await rec.reconcile_policy(body))
    assert (condition["status"], condition["reason"]) == ("False", "AsExpected")
    assert events.reasons() == ["SecretMissing", "Reconciled"]


async def test_the_redis_password_and_admin_token_are_checked(
    kube: FakeKube, events: Events
) -> None:
    put_pool(kube)
    redis = {"url": "redis://r:6379/0", "password": {"name": "redis", "key": "redis-password"}}
    body = put_policy(
        kube,
        directory={"backend": "redis", "redis": redis},
        router={"adminToken": {"name": "admin", "key": "token"}},
    )
    message = degraded(await reconciler(kube, events).reconcile_policy(body))["message"]
    assert "Secret admin not found" in message and "Secret redis not found" in message


async def test_the_redis_ca_bundle_is_checked(kube: FakeKube, events: Events) -> None:
    put_pool(kube)
    redis = {"url": "rediss://r:6379/0", "caBundle": {"configMap": "redis-ca", "key": "ca.crt"}}
    body = put_policy(kube, directory={"backend": "redis", "redis": redis})
    condition = degraded(await reconciler(kube, events).reconcile_policy(body))
    assert condition["reason"] == "ConfigMapMissing"
    assert "ConfigMap redis-ca not found in namespace default" in condition["message"]


async def test_a_missing_tokenizer_config_map_is_named(kube: FakeKube, events: Events) -> None:
    put_pool(kube, tokenizer={"configMap": "llama-tokenizer"})
    condition = degraded(await reconciler(kube, events).reconcile_policy(put_policy(kube)))
    assert condition["reason"] == "ConfigMapMissing"
    assert "ConfigMap llama-tokenizer (a pool's spec.tokenizer.configMap)" in condition["message"]


async def test_a_missing_pool_and_secret_are_both_reported(kube: FakeKube, events: Events) -> None:
    put_pool(kube)
    body = put_policy(kube, pools=["llama", "batch"], tenants=TENANTS)
    condition = degraded(await reconciler(kube, events).reconcile_policy(body))
    assert condition["reason"] == "PoolsMissing"
    assert "InferencePool batch not found" in condition["message"]
    assert "Secret tenants not found" in condition["message"]


async def test_an_unreadable_secret_is_not_called_missing(kube: FakeKube, events: Events) -> None:
    put_pool(kube)
    original = kube.get

    async def forbidden_secrets(api_version: str, kind: str, namespace: str, name: str) -> Any:
        if kind == "Secret":
            raise KubeError(403, "secrets is forbidden")
        return await original(api_version, kind, namespace, name)

    kube.get = forbidden_secrets  # type: ignore[method-assign]
    status = await reconciler(kube, events).reconcile_policy(put_policy(kube, tenants=TENANTS))
    assert degraded(status)["status"] == "False"
