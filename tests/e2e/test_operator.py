"""The whole stack on the test cluster: operator (deploy/), pools of simulated vLLM pods, a
RoutingPolicy's router with a Redis directory, and requests through it.

The steps run in order on one namespace (module-scoped fixtures): a later step builds on the
state an earlier one left, as a user's session would.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from e2e_cluster import KVGATE_IMAGE, VLLM_IMAGE, Cluster, pod_ready, ready_pods, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
POOL_SELECTOR = "app.kubernetes.io/component=engine,app.kubernetes.io/instance=sim"
ROUTER_SELECTOR = "app.kubernetes.io/component=router,app.kubernetes.io/instance=chat"
PROMPT = "You are a careful assistant. " * 40  # ~ 280 tokens: many full blocks


def operator_manifests() -> str:
    """deploy/ as shipped, with the image under test."""
    text = (REPO / "deploy" / "rbac" / "operator.yaml").read_text() + "\n---\n"
    text += (REPO / "deploy" / "operator.yaml").read_text()
    return re.sub(r"kvgate:\d+\.\d+\.\d+", KVGATE_IMAGE, text)


ADAPTER = "sql-adapter"  # the pool's LoRA adapter (the simulated engines serve it as a model)


def pool_manifest(replicas: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "sim"},
            "spec": {
                "model": "sim-model",
                "replicas": replicas,
                "image": VLLM_IMAGE,  # default command `vllm serve`: the pod runner simulates it
                "gpus": 0,
                "engine": {"blockSize": 16, "maxModelLen": 4096},
                "cache": {"hashAlgo": "sha256_cbor", "hashSeed": 0},
                "lora": {"adapters": [{"name": ADAPTER, "path": "/adapters/sql"}]},
            },
        }
    )


def policy_manifest(namespace: str, affinity_wait: float = 2.0) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "RoutingPolicy",
            "metadata": {"name": "chat"},
            "spec": {
                "pools": ["sim"],
                "scoring": {"maxAffinityWaitSeconds": affinity_wait},
                "sessions": {"header": "x-session-id"},
                "directory": {
                    "backend": "redis",
                    # Through the pod runner's userspace Service proxy on a busy 2-core CI
                    # machine a Redis call can take longer than the 50 ms default.
                    "redis": {
                        "url": f"redis://kvgate-redis.{namespace}.svc:6379/0",
                        "socketTimeoutSeconds": 0.5,
                    },
                },
            },
        }
    )


REDIS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: kvgate-redis}
spec:
  replicas: 1
  selector: {matchLabels: {app: kvgate-redis}}
  template:
    metadata: {labels: {app: kvgate-redis}}
    spec:
      containers:
      - name: redis
        image: redis:7
        ports: [{name: redis, containerPort: 6379}]
        readinessProbe: {tcpSocket: {port: redis}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: kvgate-redis}
spec:
  selector: {app: kvgate-redis}
  ports: [{name: redis, port: 6379, targetPort: redis}]
"""


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for item in obj.get("status", {}).get("conditions", []):
        if item["type"] == kind:
            return str(item["status"])
    return None


@pytest.fixture(scope="module")
def stack_ns(cluster: Cluster, crds: list[str]) -> Iterator[str]:
    """The operator (deploy/) running as a pod, and a namespace with Redis for the stack."""
    cluster.apply(operator_manifests())
    wait_until(
        lambda: ready_pods(cluster, "kvgate-system", "app.kubernetes.io/component=operator"),
        timeout=90,
        what="the operator pod",
    )
    name = "e2e-stack"
    cluster.kubectl("create", "namespace", name)
    cluster.apply(REDIS, name)
    yield name
    # Custom resources go before the operator, so that their finalizers can run.
    cluster.kubectl(
        "delete",
        "routingpolicies.kvgate.io,inferencepools.kvgate.io",
        "--all",
        "-n",
        name,
        "--timeout",
        "60s",
        check=False,
        timeout=90,
    )
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "-f", "-", "--wait=false", input=operator_manifests(), check=False)


def redis_client(cluster: Cluster, namespace: str) -> redis.Redis:
    pods = wait_until(
        lambda: ready_pods(cluster, namespace, "app=kvgate-redis"), timeout=60, what="redis"
    )
    return redis.Redis(host=pods[0]["status"]["podIP"], port=6379, socket_timeout=2)


def router_url(cluster: Cluster, namespace: str) -> str:
    """The router's Service ClusterIP (reached through the pod runner's service proxy)."""
    services = cluster.get("services", "-n", namespace, "-l", ROUTER_SELECTOR)["items"]
    assert len(services) == 1, services
    port = next(p["port"] for p in services[0]["spec"]["ports"] if p["name"] == "http")
    return f"http://{services[0]['spec']['clusterIP']}:{port}"


def complete(url: str, prompt: str, session: str | None = None) -> httpx.Response:
    headers = {"x-session-id": session} if session else {}
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": "sim-model", "prompt": prompt, "max_tokens": 4},
        headers=headers,
        timeout=30,
    )


def try_complete(url: str, prompt: str, session: str | None = None) -> httpx.Response | None:
    """``complete``, or None while the Service has no endpoint yet (connection refused/closed)."""
    try:
        return complete(url, prompt, session)
    except httpx.TransportError:
        return None


def test_pool_becomes_a_ready_deployment_of_simulated_pods(cluster: Cluster, stack_ns: str) -> None:
    cluster.apply(pool_manifest(replicas=2), stack_ns)
    pool = wait_until(
        lambda: (
            (p := cluster.get("inferencepools.kvgate.io", "sim", "-n", stack_ns))
            and condition(p, "Ready") == "True"
            and p["status"].get("readyReplicas") == 2
            and p
        ),
        timeout=120,
        what="InferencePool Ready with 2 ready replicas",
    )
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]
    deployment = cluster.get("deployment", "sim", "-n", stack_ns)
    assert deployment["status"]["readyReplicas"] == 2
    pods = ready_pods(cluster, stack_ns, POOL_SELECTOR)
    # Each pod is a real `kvgate sim serve` with the flags the operator rendered.
    for pod in pods:
        health = httpx.get(f"http://{pod['status']['podIP']}:8000/health", timeout=5)
        assert health.status_code == 200
        assert "simulated vLLM pod" in cluster.pod_logs(stack_ns, pod["metadata"]["name"])


def test_kubectl_scale_on_the_pool(cluster: Cluster, stack_ns: str) -> None:
    cluster.kubectl("scale", "inferencepools.kvgate.io", "sim", "-n", stack_ns, "--replicas=3")
    wait_until(
        lambda: len(ready_pods(cluster, stack_ns, POOL_SELECTOR)) == 3,
        timeout=90,
        what="3 ready engine pods",
    )
    wait_until(
        lambda: (
            cluster.get("inferencepools.kvgate.io", "sim", "-n", stack_ns)["status"].get(
                "readyReplicas"
            )
            == 3
        ),
        timeout=60,
        what="status.readyReplicas == 3",
    )


def test_policy_runs_a_router_that_routes_to_pool_pods(cluster: Cluster, stack_ns: str) -> None:
    cluster.apply(policy_manifest(stack_ns), stack_ns)
    wait_until(
        lambda: ready_pods(cluster, stack_ns, ROUTER_SELECTOR),
        timeout=120,
        what="a ready router pod",
    )
    url = router_url(cluster, stack_ns)
    pool_pods = {
        f"{stack_ns}/{p['metadata']['name']}" for p in ready_pods(cluster, stack_ns, POOL_SELECTOR)
    }
    first = wait_until(
        lambda: (
            (r := try_complete(url, PROMPT + "first", session="s1")) is not None
            and r.status_code == 200
            and r
        ),
        timeout=60,
        what="a first successful request",
    )
    assert first.headers["x-kvgate-endpoint"] in pool_pods
    # The same session again: the engine reports the shared prefix as cached.
    second = complete(url, PROMPT + "second", session="s1")
    assert second.status_code == 200
    assert second.headers["x-kvgate-endpoint"] == first.headers["x-kvgate-endpoint"]
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 * 10, second.json()["usage"]


def test_the_pools_lora_adapter_is_served_and_cached_under_its_own_keys(
    cluster: Cluster, stack_ns: str
) -> None:
    """The operator rendered --enable-lora/--lora-modules and the adapter into the router config:
    an adapter request is served, hits its own earlier blocks, never the base model's."""
    url = router_url(cluster, stack_ns)
    body = {"model": ADAPTER, "prompt": PROMPT + "first", "max_tokens": 4}  # base model's prompt

    def send() -> httpx.Response:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        return response

    first, second = send(), send()
    assert first.json()["model"] == ADAPTER
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second.headers["x-kvgate-endpoint"] == first.headers["x-kvgate-endpoint"]
    assert second.headers["x-kvgate-decision"] == "prefix-hit"
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 10


def test_router_finds_pods_added_by_a_scale_up(cluster: Cluster, stack_ns: str) -> None:
    cluster.kubectl("scale", "inferencepools.kvgate.io", "sim", "-n", stack_ns, "--replicas=4")
    pods = wait_until(
        lambda: (p := ready_pods(cluster, stack_ns, POOL_SELECTOR)) and len(p) == 4 and p,
        timeout=90,
        what="4 ready engine pods",
    )
    url = router_url(cluster, stack_ns)
    wanted = {f"{stack_ns}/{p['metadata']['name']}" for p in pods}
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    n = 0
    while seen != wanted and time.monotonic() < deadline:
        n += 1
        response = complete(url, f"unrelated prompt number {n} " * 20)  # no shared prefix
        assert response.status_code == 200, response.text
        seen.add(response.headers["x-kvgate-endpoint"])
    assert seen == wanted


def test_deleting_a_pod_fails_no_request_and_clears_its_directory_entries(
    cluster: Cluster, stack_ns: str
) -> None:
    url = router_url(cluster, stack_ns)
    warm = complete(url, PROMPT + "victim", session="victim")
    assert warm.status_code == 200
    victim = warm.headers["x-kvgate-endpoint"]
    store = redis_client(cluster, stack_ns)
    base = f"kvgate:{{{stack_ns}/sim}}:"
    wait_until(
        lambda: store.hlen(f"{base}x:{victim}") > 0,
        timeout=20,
        what="the victim's KV events in the Redis directory",
    )

    def send(i: int) -> int:
        return complete(url, f"{PROMPT} load {i}", session=f"load-{i % 4}").status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(send, i) for i in range(12)]
        time.sleep(0.2)
        cluster.kubectl("delete", "pod", "-n", stack_ns, victim.split("/", 1)[1], "--wait=false")
        deleted_at = time.monotonic()
        wait_until(
            lambda: (
                not store.exists(f"{base}x:{victim}") and not store.hexists(f"{base}pods", victim)
            ),
            timeout=10,
            interval=0.05,
            what="the victim's directory entries to go",
        )
        cleared_after = time.monotonic() - deleted_at
        statuses = [f.result() for f in futures]
    assert statuses == [200] * len(statuses)
    assert cleared_after <= 2.0, f"directory entries of a deleted pod lived {cleared_after:.2f} s"


def router_metric(cluster: Cluster, namespace: str, name: str) -> float:
    pod = ready_pods(cluster, namespace, ROUTER_SELECTOR)[0]
    text = httpx.get(f"http://{pod['status']['podIP']}:8000/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def test_editing_the_policy_reconfigures_the_router_without_a_restart(
    cluster: Cluster, stack_ns: str
) -> None:
    before = ready_pods(cluster, stack_ns, ROUTER_SELECTOR)
    reloads = router_metric(cluster, stack_ns, 'kvgate_router_config_reloads_total{result="ok"}')
    cluster.apply(policy_manifest(stack_ns, affinity_wait=0.5), stack_ns)
    wait_until(
        lambda: (
            router_metric(cluster, stack_ns, 'kvgate_router_config_reloads_total{result="ok"}')
            > reloads
        ),
        timeout=30,
        what="a config reload in the router",
    )
    after = ready_pods(cluster, stack_ns, ROUTER_SELECTOR)
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before]
    assert [p["status"]["containerStatuses"][0]["restartCount"] for p in after] == [
        p["status"]["containerStatuses"][0]["restartCount"] for p in before
    ]
    assert complete(router_url(cluster, stack_ns), PROMPT).status_code == 200


def children(cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """kind/name -> (uid, resourceVersion) of everything the operator made here."""
    found = {}
    for kind in ("deployments", "services", "configmaps", "poddisruptionbudgets"):
        for item in cluster.get(kind, "-n", namespace, "-l", "app.kubernetes.io/managed-by=kvgate")[
            "items"
        ]:
            meta = item["metadata"]
            found[f"{kind}/{meta['name']}"] = (meta["uid"], meta["resourceVersion"])
    return found


def test_operator_restart_recreates_nothing(cluster: Cluster, stack_ns: str) -> None:
    before = children(cluster, stack_ns)
    assert any(k.startswith("deployments/") for k in before)
    old = ready_pods(cluster, "kvgate-system", "app.kubernetes.io/component=operator")
    cluster.kubectl("delete", "pod", "-n", "kvgate-system", old[0]["metadata"]["name"], timeout=60)
    new = wait_until(
        lambda: [
            p
            for p in ready_pods(cluster, "kvgate-system", "app.kubernetes.io/component=operator")
            if p["metadata"]["uid"] != old[0]["metadata"]["uid"]
        ],
        timeout=60,
        what="a new operator pod",
    )
    assert new
    time.sleep(8)  # let the new operator list, reconcile and resync once
    after = children(cluster, stack_ns)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}
    changed = [
        k for k in before if before[k][1] != after[k][1] and not k.startswith("deployments/")
    ]
    assert changed == [], f"rewritten by a restarted operator: {changed}"


def test_deleting_the_pool_clears_its_directory_entries(cluster: Cluster, stack_ns: str) -> None:
    store = redis_client(cluster, stack_ns)
    base = f"kvgate:{{{stack_ns}/sim}}:"
    complete(router_url(cluster, stack_ns), PROMPT + "before delete")
    wait_until(lambda: store.hlen(f"{base}pods") > 0, timeout=20, what="pool entries in Redis")
    cluster.kubectl(
        "delete", "inferencepools.kvgate.io", "sim", "-n", stack_ns, "--timeout", "60s", timeout=90
    )
    assert list(store.scan_iter(match=f"{base}x:*")) == []
    assert store.hlen(f"{base}pods") == 0
    wait_until(
        lambda: not cluster.get("pods", "-n", stack_ns, "-l", POOL_SELECTOR)["items"],
        timeout=60,
        what="the engine pods to go",
    )
    assert not [
        p
        for p in cluster.get("pods", "-n", stack_ns)["items"]
        if "sim" in p["metadata"]["name"] and pod_ready(p)
    ]


REDIS_TLS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: kvgate-redis-tls}
spec:
  replicas: 1
  selector: {matchLabels: {app: kvgate-redis-tls}}
  template:
    metadata: {labels: {app: kvgate-redis-tls}}
    spec:
      containers:
      - name: redis
        image: redis:7
        args: [redis-server, --port, "0", --tls-port, "6380", --tls-cert-file, /tls/tls.crt,
               --tls-key-file, /tls/tls.key, --tls-auth-clients, "no", --requirepass, "e2e-pw"]
        ports: [{name: redis, containerPort: 6380}]
        readinessProbe: {tcpSocket: {port: redis}, periodSeconds: 2}
        volumeMounts: [{name: tls, mountPath: /tls, readOnly: true}]
      volumes: [{name: tls, secret: {secretName: redis-server-tls}}]
---
apiVersion: v1
kind: Service
metadata: {name: kvgate-redis-tls}
spec:
  selector: {app: kvgate-redis-tls}
  ports: [{name: redis, port: 6380, targetPort: redis}]
"""


def test_a_directory_on_tls_redis_named_by_secrets(
    cluster: Cluster, stack_ns: str, tmp_path: Path
) -> None:
    """Redis as users deploy it: TLS only, a password inside a URL kept in a Secret, the CA in a
    ConfigMap. The operator passes them; the router's directory works over TLS, and deleting the
    pool clears its entries through the same connection settings. The pool's engines also run
    with vLLM's CPU offloading flags, which the router config then prices."""
    from tests.integration.conftest import make_tls_files

    host = f"kvgate-redis-tls.{stack_ns}.svc"
    tls = make_tls_files(tmp_path, hosts=[host])
    kubectl = cluster.kubectl
    kubectl("create", "secret", "generic", "redis-server-tls", "-n", stack_ns,
            f"--from-file=tls.crt={tls.cert}", f"--from-file=tls.key={tls.key}")  # fmt: skip
    kubectl("create", "configmap", "redis-ca", "-n", stack_ns, f"--from-file=ca.crt={tls.ca}")
    kubectl("create", "secret", "generic", "managed-redis", "-n", stack_ns,
            f"--from-literal=url=rediss://:e2e-pw@{host}:6380/0")  # fmt: skip
    cluster.apply(REDIS_TLS, stack_ns)
    pool = yaml.safe_load(pool_manifest(replicas=1))
    pool["metadata"]["name"] = "tls-sim"
    pool["spec"]["engine"]["cpuOffloadGib"] = 0.25  # vLLM's flags, accepted by the engine pods
    cluster.apply(yaml.safe_dump(pool), stack_ns)
    policy = yaml.safe_load(policy_manifest(stack_ns))
    policy["metadata"]["name"] = "tls"
    policy["spec"]["pools"] = ["tls-sim"]
    policy["spec"]["directory"]["redis"] = {
        "urlSecret": {"name": "managed-redis", "key": "url"},
        "caBundle": {"configMap": "redis-ca", "key": "ca.crt"},
        "socketTimeoutSeconds": 0.5,
    }
    cluster.apply(yaml.safe_dump(policy), stack_ns)
    config = wait_until(
        lambda: cluster.get("configmaps", "-n", stack_ns, "--field-selector",
                            "metadata.name=tls-router-config")["items"],
        timeout=60,
        what="the router config",
    )  # fmt: skip
    assert "cpu_offload: true" in config[0]["data"]["router.yaml"]
    selector = "app.kubernetes.io/component=router,app.kubernetes.io/instance=tls"
    wait_until(lambda: ready_pods(cluster, stack_ns, selector), timeout=120, what="the router")
    service = cluster.get("services", "-n", stack_ns, "-l", selector)["items"][0]
    url = f"http://{service['spec']['clusterIP']}:8000"
    first = wait_until(
        lambda: (r := try_complete(url, PROMPT + "tls")) is not None and r.status_code == 200 and r,
        timeout=90,
        what="a request through the router on the TLS directory",
    )
    redis_pod = wait_until(
        lambda: ready_pods(cluster, stack_ns, "app=kvgate-redis-tls"), timeout=60, what="redis"
    )[0]
    store = redis.Redis(
        host=redis_pod["status"]["podIP"], port=6380, password="e2e-pw", ssl=True,
        ssl_ca_certs=str(tls.ca), ssl_check_hostname=False, socket_timeout=2,
    )  # fmt: skip
    base = f"kvgate:{{{stack_ns}/tls-sim}}:"
    holder = first.headers["x-kvgate-endpoint"]
    wait_until(lambda: store.hlen(f"{base}x:{holder}") > 0, timeout=30, what="entries over TLS")
    second = complete(url, PROMPT + "tls again")
    assert second.headers["x-kvgate-endpoint"] == holder
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 10
    # The finalizer reads the same Secret and ConfigMap to reach Redis.
    kubectl("delete", "inferencepool", "tls-sim", "-n", stack_ns, "--timeout", "60s", timeout=90)
    assert store.hlen(f"{base}pods") == 0
    events = cluster.get("events", "-n", stack_ns, "--field-selector", "reason=DirectoryCleared")
    messages = " ".join(e.get("message", "") for e in events["items"])
    assert f"rediss://:***@{host}:6380/0" in messages and "e2e-pw" not in messages
    kubectl("delete", "routingpolicy", "tls", "-n", stack_ns, "--timeout", "60s", timeout=90)
    store.close()
