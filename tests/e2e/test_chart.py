"""charts/kvgate on the real control plane: install, serve a request through the stack it runs,
upgrade (adding the indexer), uninstall (CRDs kept).

helm is the pinned binary of tests/unit/chart/helm_tool.py. The release installs the operator
(with the chart's RBAC, exercised for real through the pod's bound token), the CRDs and Redis;
an InferencePool of simulated vLLM pods and a RoutingPolicy then make the operator run a router,
and a completion goes through it. The upgrade adds the indexer, whose KV events land in the
chart's Redis with the generated password.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_cluster import KVGATE_IMAGE, VLLM_IMAGE, Cluster, ready_pods, wait_until
from tests.unit.chart.helm_tool import helm_binary

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvgate"
RELEASE = "e2e-chart"
FULLNAME = f"{RELEASE}-kvgate"
CRD_NAMES = ("inferencepools.kvgate.io", "routingpolicies.kvgate.io")


def helm(cluster: Cluster, *args: str, timeout: float = 300, check: bool = True) -> str:
    try:
        binary = helm_binary()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        pytest.fail(f"cannot get helm: {exc}")
    result = subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        env={**cluster.env, "HELM_CACHE_HOME": str(cluster.state_dir / "helm-cache")},
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0 and check:
        namespace = args[args.index("--namespace") + 1] if "--namespace" in args else "default"
        pytest.fail(
            f"helm {' '.join(args)} failed:\n{result.stderr}\n{cluster.diagnose(namespace)}"
        )
    return result.stdout if result.returncode == 0 else ""


def image_values() -> list[str]:
    repository, _, tag = KVGATE_IMAGE.rpartition(":")
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


def redis_command(ip: str, password: str, command: str) -> bytes:
    """One command after AUTH on the chart's Redis; the raw reply of the command."""
    try:
        with socket.create_connection((ip, 6379), timeout=2) as sock:
            sock.sendall(f"AUTH {password}\r\n{command}\r\n".encode())
            reply = b""
            while reply.count(b"\r\n") < 2:
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return b""
    if not reply.startswith(b"+OK\r\n"):
        return b""
    return reply.removeprefix(b"+OK\r\n")


def workload(policy: str) -> str:
    pool = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "sim"},
        "spec": {
            "model": "sim-model",
            "replicas": 2,
            "image": VLLM_IMAGE,
            "gpus": 0,
            "engine": {"blockSize": 16, "maxModelLen": 4096},
            "cache": {"hashAlgo": "sha256_cbor", "hashSeed": 0},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    }
    # The router keeps its own (memory) directory; the chart's indexer feeds Redis after the
    # upgrade (test_docs.py runs a router on the chart's Redis).
    routing = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "RoutingPolicy",
        "metadata": {"name": policy},
        "spec": {"pools": ["sim"]},
    }
    return json.dumps(pool) + "\n---\n" + json.dumps(routing)


def redis_password(cluster: Cluster, namespace: str) -> str:
    secret = cluster.get("secret", f"{FULLNAME}-redis", "-n", namespace)
    return base64.b64decode(secret["data"]["redis-password"]).decode()


@pytest.fixture
def release_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The test's namespace; a release the test left behind (it failed) is removed for sure,
    so that its operator cannot compete with the operators of later tests."""
    yield namespace
    if helm(cluster, "status", RELEASE, "-n", namespace, check=False):
        cluster.kubectl("delete", "routingpolicies.kvgate.io,inferencepools.kvgate.io", "--all", "-n", namespace,
                        "--wait=true", timeout=120, check=False)  # fmt: skip
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "120s",
             check=False)  # fmt: skip


def test_install_serve_upgrade_uninstall(cluster: Cluster, release_namespace: str) -> None:
    namespace = release_namespace
    common = ["--namespace", namespace, "--wait", "--timeout", "180s"]
    # Install (taking over CRDs another test may have applied with kubectl).
    out = helm(cluster, "install", RELEASE, str(CHART), *common, *image_values(),
               "--set", "operator.resyncSeconds=5", "--take-ownership", "--force-conflicts")  # fmt: skip
    assert "-f examples/pool-simulated.yaml -f examples/policy-simulated.yaml" in out  # NOTES
    for crd in CRD_NAMES:
        found = cluster.get("crd", crd)
        assert found["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    operator = cluster.get("deployment", f"{FULLNAME}-operator", "-n", namespace)
    assert operator["status"].get("readyReplicas") == 1
    password = redis_password(cluster, namespace)
    (redis_pod,) = ready_pods(cluster, namespace, "app.kubernetes.io/component=redis")
    redis_ip = redis_pod["status"]["podIP"]
    assert redis_command(redis_ip, password, "PING") == b"+PONG\r\n"
    assert redis_command(redis_ip, "wrong", "PING") == b""  # auth is required

    # The operator the chart runs serves a pool and a policy on the chart's Redis.
    cluster.apply(workload("web"), namespace)
    router: Any = wait_until(
        lambda: (p := ready_pods(cluster, namespace, "app.kubernetes.io/component=router")) and p[0],
        timeout=120,
        what="a ready router pod (rendered by the chart's operator)",
    )  # fmt: skip
    wait_until(
        lambda: len(ready_pods(cluster, namespace, "app.kubernetes.io/component=engine")) == 2,
        timeout=120,
        what="2 ready engine pods",
    )
    url = f"http://{router['status']['podIP']}:8000/v1/completions"
    body = {"model": "sim-model", "prompt": list(range(100, 400)), "max_tokens": 4}

    def answered() -> httpx.Response | None:
        try:
            response = httpx.post(url, json=body, timeout=10)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 200 else None

    response = wait_until(answered, timeout=60, what="a completion through the router")
    assert response.headers["x-kvgate-pool"].endswith("sim")
    assert response.json()["usage"]["prompt_tokens"] == 300

    # Upgrade: add the indexer. The generated Redis password survives the upgrade.
    helm(cluster, "upgrade", RELEASE, str(CHART), *common, *image_values(),
         "--set", "operator.resyncSeconds=5", "--set", "indexer.enabled=true",
         "--set", "indexer.pools[0].name=sim", "--set", "indexer.pools[0].model=sim-model")  # fmt: skip
    assert redis_password(cluster, namespace) == password
    (indexer,) = ready_pods(cluster, namespace, "app.kubernetes.io/component=indexer")
    metrics = httpx.get(f"http://{indexer['status']['podIP']}:8001/metrics", timeout=5).text
    assert "kvgate_directory_subscriptions" in metrics
    # KV events of a new request reach the chart's Redis through the indexer (password from env).
    body["prompt"] = list(range(1000, 1400))
    wait_until(answered, timeout=30, what="a second completion")
    wait_until(
        lambda: redis_command(redis_ip, password, "DBSIZE") not in (b"", b":0\r\n"),
        timeout=60,
        what="the indexer's first keys in the chart's Redis",
    )
    history = json.loads(helm(cluster, "history", RELEASE, "-n", namespace, "-o", "json"))
    assert [h["revision"] for h in history] == [1, 2]

    # Uninstall: custom resources first (their finalizers need the operator), CRDs stay.
    cluster.kubectl("delete", "routingpolicy/web", "inferencepool/sim", "-n", namespace,
                    "--wait=true", timeout=120)  # fmt: skip
    helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "120s")
    gone = cluster.kubectl("get", "deployment", f"{FULLNAME}-operator", "-n", namespace,
                           check=False)  # fmt: skip
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert cluster.kubectl("get", "clusterrole", f"{FULLNAME}-operator", check=False).returncode
    for crd in CRD_NAMES:
        cluster.get("crd", crd)  # kept (helm.sh/resource-policy: keep)
