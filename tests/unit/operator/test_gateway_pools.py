"""RoutingPolicy `poolRefs` to Gateway API Inference Extension InferencePools: the operator
renders a headless Service with the upstream pool's selector and port, and the router config
discovers the pool's pods through it with the reference's engine facts."""

from __future__ import annotations

from typing import Any

from fake_kube import Events, FakeKube
from test_kopf_handlers import memo_for
from test_reconciler import condition, make, policy

from kvgate.api.router_config import parse_router_config
from kvgate.operator import gateway_pools
from kvgate.operator.handlers_common import plain

Json = dict[str, Any]


def upstream_pool(name: str = "gie", port: int = 8000, **labels: str) -> Json:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels or {"app": "vllm-llama"}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}},
        },
    }


REF = {
    "name": "gie",
    "model": "llama-3.1-8b",
    "blockSize": 32,
    "cache": {"hashAlgo": "sha256_cbor", "hashSeed": 7},
    "kvEvents": True,
    "loraAdapters": [{"name": "sql", "path": "/adapters/sql"}],
}


def gateway_policy(**ref: Any) -> Json:
    return policy(pools=[], poolRefs=[{**REF, **ref}])


async def test_a_gateway_pool_becomes_a_headless_service_and_a_router_pool(
    kube: FakeKube, events: Events
) -> None:
    kube.put(upstream_pool(port=8080))
    status = await make(kube, events).reconcile_policy(kube.put(gateway_policy()))
    assert status is not None and condition(status, "Degraded")["status"] == "False"
    service = kube.find("Service", "front-gie-engines")
    assert service is not None
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app": "vllm-llama"}
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": 8080,
        "kv-events": 5557,
        "kv-replay": 5558,
    }
    assert service["metadata"]["ownerReferences"][0]["kind"] == "RoutingPolicy"
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None
    (pool,) = parse_router_config(config_map["data"]["router.yaml"]).pools
    assert (pool.key, pool.model) == ("default/gie", "llama-3.1-8b")
    assert pool.endpoints.kubernetes is not None
    assert pool.endpoints.kubernetes.service == "front-gie-engines"
    engine = pool.engine
    assert (engine.block_size, engine.hash_algo, engine.hash_seed) == (32, "sha256_cbor", "7")
    assert engine.kv_events is True
    assert [(a.name, a.path) for a in pool.lora_adapters] == [("sql", "/adapters/sql")]


async def test_a_gateway_pools_api_key_reaches_its_router_from_the_secret(
    kube: FakeKube, events: Events
) -> None:
    """Engines run with `--api-key` answer 401 to a router without it: the reference names the
    Secret key, which the router container gets as an environment variable (never copied)."""
    kube.put(upstream_pool())
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "engines", "namespace": "default"},
            "data": {"key": "c2stcG9k"},  # "sk-pod"
        }
    )
    body = kube.put(gateway_policy(apiKey={"name": "engines", "key": "key"}))
    status = await make(kube, events).reconcile_policy(body)
    assert status is not None and condition(status, "Degraded")["status"] == "False"
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None and "sk-pod" not in config_map["data"]["router.yaml"]
    (pool,) = parse_router_config(config_map["data"]["router.yaml"]).pools
    assert pool.engine.api_key is not None and pool.engine.api_key.env is not None
    router = kube.find("Deployment", "front-router")
    assert router is not None
    (container,) = router["spec"]["template"]["spec"]["containers"]
    sources = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert sources[pool.engine.api_key.env] == {"secretKeyRef": {"name": "engines", "key": "key"}}


async def test_gateway_pools_route_alongside_kvgate_pools(kube: FakeKube, events: Events) -> None:
    from test_reconciler import pool

    kube.put(pool())
    kube.put(upstream_pool())
    body = kube.put(policy(poolRefs=[{**REF, "kvEvents": False}]))
    status = await make(kube, events).reconcile_policy(body)
    assert status is not None and status["pools"] == ["llama", "gie"]
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None
    pools = parse_router_config(config_map["data"]["router.yaml"]).pools
    assert [p.endpoints.kubernetes.service for p in pools if p.endpoints.kubernetes] == [
        "llama",
        "front-gie-engines",
    ]
    assert [p.engine.kv_events for p in pools] == [True, False]
    service = kube.find("Service", "front-gie-engines")
    assert service is not None and [p["name"] for p in service["spec"]["ports"]] == ["http"]


async def test_a_gateway_pool_named_as_a_kvgate_pool_of_the_policy_is_left_out_and_said(
    kube: FakeKube, events: Events
) -> None:
    """Both kinds of InferencePool may share a name; the router names pools by namespace and
    name, so the rendered config was refused whole ("pairs must be unique")."""
    from test_reconciler import pool

    kube.put(pool())
    kube.put(upstream_pool(name="llama"))
    body = kube.put(policy(poolRefs=[{**REF, "name": "llama"}]))
    status = await make(kube, events).reconcile_policy(body)
    assert status is not None and status["pools"] == ["llama"]
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PoolsMissing"
    assert "poolRefs llama: a kvgate InferencePool this policy serves" in degraded["message"]
    config_map = kube.find("ConfigMap", "front-router-config")
    assert config_map is not None
    (served,) = parse_router_config(config_map["data"]["router.yaml"]).pools
    assert served.endpoints.kubernetes is not None
    assert served.endpoints.kubernetes.service == "llama"


async def test_missing_or_unusable_gateway_pools_degrade_the_policy(
    kube: FakeKube, events: Events
) -> None:
    reconciler = make(kube, events)
    status = await reconciler.reconcile_policy(kube.put(gateway_policy()))
    assert status is not None
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NoPools"
    assert "InferencePool (inference.networking.k8s.io/v1) gie not found" in degraded["message"]
    broken = upstream_pool()
    broken["spec"]["targetPorts"] = []
    kube.put(broken)
    status = await reconciler.reconcile_policy(kube.put(gateway_policy()))
    assert status is not None
    assert "spec.targetPorts is empty" in condition(status, "Degraded")["message"]
    assert kube.find("Service", "front-gie-engines") is None


async def test_an_upstream_pool_change_reaches_the_rendered_service(
    kube: FakeKube, events: Events
) -> None:
    memo = memo_for(kube, events)
    kube.put(upstream_pool())
    await memo.reconciler.reconcile_policy(kube.put(gateway_policy()))
    changed = kube.put(upstream_pool(port=9000, app="vllm-llama-v2"))
    event = {"type": "MODIFIED", "object": changed}
    await gateway_pools.gateway_pool_event(event=event, body=plain(changed), memo=memo)  # type: ignore[arg-type]
    service = kube.find("Service", "front-gie-engines")
    assert service is not None
    assert service["spec"]["selector"] == {"app": "vllm-llama-v2"}
    assert service["spec"]["ports"][0]["targetPort"] == 9000
