"""The test cluster itself: nodes, and pods run as real local processes by the pod runner."""

from __future__ import annotations

import socket

import pytest
from e2e_cluster import Cluster, pod_ready, ready_pods, wait_until

pytestmark = pytest.mark.e2e


def redis_ping(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_kwok_nodes_are_ready_with_pod_ranges(cluster: Cluster) -> None:
    nodes = cluster.get("nodes")["items"]
    assert len(nodes) == cluster.nodes
    for node in nodes:
        assert node["spec"]["podCIDR"].startswith("10.244.")
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
    version = cluster.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.' in version


REDIS_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: cache}
spec:
  replicas: 2
  selector: {matchLabels: {app: cache}}
  template:
    metadata: {labels: {app: cache}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: redis
        image: redis:7
        args: ["--maxmemory", "16mb"]
        ports: [{name: redis, containerPort: 6379}]
        readinessProbe:
          tcpSocket: {port: redis}
          periodSeconds: 2
"""


def test_deployment_pods_run_as_processes_on_their_pod_ips(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(REDIS_DEPLOYMENT, namespace)
    pods = wait_until(
        lambda: (p := ready_pods(cluster, namespace, "app=cache")) and len(p) == 2 and p,
        timeout=60,
        what="2 ready redis pods",
    )
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and all(ip.startswith("10.244.") for ip in ips)
    for ip in ips:
        assert redis_ping(ip, 6379), f"no redis-server answering on {ip}:6379"
    deployment = cluster.get("deployment", "cache", "-n", namespace)
    assert deployment["status"]["readyReplicas"] == 2

    # Deleting a pod stops its process, and the ReplicaSet's replacement gets one.
    victim = pods[0]
    cluster.kubectl(
        "delete", "pod", "-n", namespace, victim["metadata"]["name"], "--wait=true", timeout=30
    )
    assert not redis_ping(victim["status"]["podIP"], 6379)
    wait_until(
        lambda: len(ready_pods(cluster, namespace, "app=cache")) == 2,
        timeout=60,
        what="the replacement pod to be ready",
    )

    # Scaling down removes processes too.
    cluster.kubectl("scale", "deployment", "cache", "-n", namespace, "--replicas=0")
    wait_until(
        lambda: not cluster.get("pods", "-n", namespace)["items"], timeout=60, what="all pods gone"
    )
    for ip in ips:
        assert not redis_ping(ip, 6379)


CRASHING_POD = """
apiVersion: v1
kind: Pod
metadata: {name: wrong-flags}
spec:
  containers:
  - name: redis
    image: redis:7
    args: ["--no-such-option", "1"]
    readinessProbe: {tcpSocket: {port: 6379}}
"""


def test_a_process_that_exits_is_restarted_and_never_ready(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(CRASHING_POD, namespace)

    def restarted() -> dict[str, object] | None:
        pod = cluster.get("pod", "wrong-flags", "-n", namespace)
        statuses = pod["status"].get("containerStatuses") or [{}]
        return pod if statuses[0].get("restartCount", 0) >= 1 else None

    pod = wait_until(restarted, timeout=30, what="a restart")
    assert not pod_ready(pod)  # type: ignore[arg-type]
    assert "no-such-option" in cluster.pod_logs(namespace, "wrong-flags")


SERVICE_AND_REPLICA = """
apiVersion: v1
kind: Service
metadata: {name: cache}
spec:
  selector: {app: cache}
  ports: [{name: redis, port: 6379, targetPort: redis}]
---
apiVersion: v1
kind: Pod
metadata: {name: replica, labels: {app: replica}}
spec:
  containers:
  - name: redis
    image: redis:7
    env:
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    args: ["--replicaof", "cache.$(POD_NAMESPACE).svc", "6379"]
    readinessProbe: {tcpSocket: {port: 6379}}
"""


def redis_command(ip: str, port: int, command: bytes) -> bytes:
    """The reply to one inline command (b"" when the server does not answer in 2 s)."""
    try:
        with socket.create_connection((ip, port), timeout=2) as sock:
            sock.sendall(command + b"\r\n")
            return sock.recv(65536)
    except OSError:
        return b""


def test_services_have_a_cluster_ip_proxy_and_a_name(cluster: Cluster, namespace: str) -> None:
    cluster.apply(REDIS_DEPLOYMENT.replace("replicas: 2", "replicas: 1"), namespace)
    cluster.apply(SERVICE_AND_REPLICA, namespace)
    cluster_ip = cluster.get("service", "cache", "-n", namespace)["spec"]["clusterIP"]
    wait_until(lambda: redis_ping(cluster_ip, 6379), timeout=60, what="the ClusterIP to answer")
    # The replica found its primary by Service name (hosts file) through the ClusterIP (proxy).
    replica = wait_until(
        lambda: (p := ready_pods(cluster, namespace, "app=replica")) and p[0],
        timeout=60,
        what="the replica pod",
    )
    wait_until(
        lambda: (
            b"master_link_status:up"
            in redis_command(replica["status"]["podIP"], 6379, b"INFO replication")
        ),
        timeout=30,
        what="replication through the Service",
    )
