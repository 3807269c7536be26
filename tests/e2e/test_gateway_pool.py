"""A RoutingPolicy routing to a Gateway API Inference Extension InferencePool
(`inference.networking.k8s.io/v1`) on the test cluster: the upstream CRD (a fixture written from
its published spec), vLLM pods deployed the way such clusters deploy them (a plain Deployment
with its own labels and flags), the operator (deploy/, with its RBAC) rendering the headless
Service and the router, and requests scored on the pods' KV events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_cluster import KVGATE_IMAGE, VLLM_IMAGE, Cluster, ready_pods, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRD = Path(__file__).resolve().parent / "data" / "inference.networking.k8s.io_inferencepools.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
ENGINES = "app=vllm-llama"
ROUTER_SELECTOR = "app.kubernetes.io/component=router,app.kubernetes.io/instance=gw"
MODEL = "llama-sim"
PROMPT = "You are a careful assistant who answers briefly. " * 30


def operator_manifests(namespace: str) -> str:
    """deploy/ as shipped, renamed into `namespace` and watching only it."""
    text = (REPO / "deploy" / "rbac" / "operator.yaml").read_text() + "\n---\n"
    text += (REPO / "deploy" / "operator.yaml").read_text()
    text = re.sub(r"kvgate:\d+\.\d+\.\d+", KVGATE_IMAGE, text)
    text = text.replace("kvgate-system", namespace).replace("kvgate-operator", f"{namespace}-op")
    return text.replace("--all-namespaces", f"--namespace, {namespace}")


def engines_manifest() -> str:
    """vLLM pods as a Gateway API user runs them: their own labels, KV events enabled."""
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
        "topic": f"kv@$(POD_IP)@{MODEL}",
    }
    container = {
        "name": "vllm",
        "image": VLLM_IMAGE,
        "command": ["vllm", "serve"],
        "args": [
            "--model",
            MODEL,
            "--port",
            "8000",
            "--block-size",
            "16",
            "--enable-prefix-caching",
            "--prefix-caching-hash-algo",
            "sha256_cbor",
            "--kv-events-config",
            json.dumps(events),
            "--enable-prompt-tokens-details",
        ],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "PYTHONHASHSEED", "value": "0"},
        ],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 2},
    }
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "vllm-llama"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "vllm-llama"}},
                "template": {
                    "metadata": {"labels": {"app": "vllm-llama"}},
                    "spec": {"containers": [container]},
                },
            },
        }
    )


def upstream_pool(**spec: object) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "llama"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-llama"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}},
                **spec,
            },
        }
    )


POLICY = yaml.safe_dump(
    {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "RoutingPolicy",
        "metadata": {"name": "gw"},
        "spec": {
            "poolRefs": [
                {
                    "group": "inference.networking.k8s.io",
                    "kind": "InferencePool",
                    "name": "llama",
                    "model": MODEL,
                    "blockSize": 16,
                    "cache": {"hashAlgo": "sha256_cbor", "hashSeed": 0},
                    "kvEvents": True,
                }
            ],
            "sessions": {"header": "x-session-id"},
        },
    }
)


@pytest.fixture(scope="module")
def gateway_ns(cluster: Cluster, crds: list[str]) -> Iterator[str]:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    name = "e2e-gateway"
    cluster.kubectl("create", "namespace", name)
    cluster.apply(operator_manifests(name), name)
    yield name
    cluster.kubectl(
        "delete",
        "routingpolicies.kvgate.io",
        "--all",
        "-n",
        name,
        "--timeout",
        "60s",
        check=False,
        timeout=90,
    )
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "-f", "-", "--wait=false", input=operator_manifests(name), check=False
    )
    # Two `inferencepool` kinds make the short name ambiguous for later tests: remove this one.
    cluster.kubectl("delete", "crd", CRD_NAME, "--wait=false", check=False)


def test_the_upstream_schema_is_enforced(cluster: Cluster, gateway_ns: str) -> None:
    for bad, message in [
        ({"targetPorts": []}, "targetPorts"),
        ({"targetPorts": [{"number": 0}]}, "targetPorts[0].number"),
        ({"selector": {"matchLabels": {}}}, "matchLabels"),
        ({"endpointPickerRef": {"name": "epp"}}, "port is required"),
    ]:
        result = cluster.kubectl(
            "apply", "-n", gateway_ns, "-f", "-", input=upstream_pool(**bad), check=False
        )
        assert result.returncode != 0 and message in result.stderr, (bad, result.stderr)
    cluster.apply(upstream_pool(), gateway_ns)
    stored = cluster.get("inferencepools.inference.networking.k8s.io", "llama", "-n", gateway_ns)
    assert stored["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"  # the default


def test_a_policy_routes_to_the_gateway_pool_with_kv_event_scoring(
    cluster: Cluster, gateway_ns: str
) -> None:
    cluster.apply(engines_manifest(), gateway_ns)
    engines = wait_until(
        lambda: (p := ready_pods(cluster, gateway_ns, ENGINES)) and len(p) == 2 and p,
        timeout=120,
        what="2 ready vLLM pods",
    )
    cluster.apply(POLICY, gateway_ns)
    wait_until(
        lambda: ready_pods(cluster, gateway_ns, ROUTER_SELECTOR), timeout=120, what="the router"
    )
    service = cluster.get("service", "gw-llama-engines", "-n", gateway_ns)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app": "vllm-llama"}
    policy = cluster.get("routingpolicies.kvgate.io", "gw", "-n", gateway_ns)
    assert policy["status"]["pools"] == ["llama"]
    router = ready_pods(cluster, gateway_ns, ROUTER_SELECTOR)[0]["status"]["podIP"]
    url = f"http://{router}:8000"
    pods = {f"{gateway_ns}/{p['metadata']['name']}" for p in engines}

    def send(text: str, session: str) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": text, "max_tokens": 4},
            headers={"x-session-id": session},
            timeout=30,
        )

    first = wait_until(
        lambda: (r := send(PROMPT + "first", "s1")).status_code == 200 and r,
        timeout=60,
        what="a first request through the router",
    )
    assert first.headers["x-kvgate-endpoint"] in pods
    # The pod's KV events reach the router's directory: the next request with the same prefix
    # is predicted as a hit there and the engine confirms the cached tokens.
    second = wait_until(
        lambda: (
            (r := send(PROMPT + "second", "s2")).status_code == 200
            and int(r.headers.get("x-kvgate-prefix-hit-tokens", "0")) >= 160
            and r
        ),
        timeout=20,
        what="a predicted prefix hit from the pods' KV events",
    )
    assert second.headers["x-kvgate-endpoint"] == first.headers["x-kvgate-endpoint"]
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 160
    seen = {
        send(f"unrelated prompt {i} " * 20, f"u{i}").headers["x-kvgate-endpoint"] for i in range(12)
    }
    assert seen == pods


def test_a_changed_upstream_selector_reaches_the_router(cluster: Cluster, gateway_ns: str) -> None:
    cluster.apply(upstream_pool(selector={"matchLabels": {"app": "nothing-here"}}), gateway_ns)
    wait_until(
        lambda: (
            cluster.get("service", "gw-llama-engines", "-n", gateway_ns)["spec"]["selector"]
            == {"app": "nothing-here"}
        ),
        timeout=30,
        what="the headless Service to follow the pool's selector",
    )
    router = ready_pods(cluster, gateway_ns, ROUTER_SELECTOR)[0]["status"]["podIP"]

    def status() -> int:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
        return httpx.post(f"http://{router}:8000/v1/completions", json=body, timeout=10).status_code

    wait_until(lambda: status() == 503, timeout=20, what="no endpoints left in the router")
    cluster.apply(upstream_pool(), gateway_ns)
    wait_until(lambda: status() == 200, timeout=30, what="the pods back in the router")
