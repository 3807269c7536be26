"""Discover a pool's ready engine pods by watching Pods in the Kubernetes API.

List the pods matching the pool's label selector, then watch from the list's resourceVersion;
every event updates the pod table and the pool's endpoints are replaced with the ready pods
(phase Running, a pod IP, condition Ready=True, not being deleted). A pod that becomes unready or
is deleted leaves the endpoint set on the event that says so, which drops it from routing and
forgets it in the directory at once (well within the 2 s budget). A watch that expires (410 Gone)
or breaks is re-listed after a short backoff.

Endpoint identity is `<namespace>/<pod>`; the generation is `<pod uid>:<engine restarts>` so that
an engine container restart invalidates the pod's directory entries. Ports are looked up by name
on the containers (`http`, `kv-events`, `kv-replay` by default), else the documented defaults.
KV events are expected under the topic the operator renders, `kv@<pod IP>@<pool model>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from kvgate.api.router_config import KubernetesDiscovery, PoolConfig
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec, kv_topic

log = logging.getLogger(__name__)


def pod_is_ready(pod: Any) -> bool:
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None:
        return False
    if status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def _port(pod: Any, name: str, default: int) -> int:
    if name.isdigit():
        return int(name)
    for container in pod.spec.containers or []:
        for port in container.ports or []:
            if port.name == name:
                return int(port.container_port)
    return default


def pod_spec(pool: PoolConfig, disc: KubernetesDiscovery, pod: Any) -> EndpointSpec:
    ip = pod.status.pod_ip
    host = f"[{ip}]" if ":" in ip else ip
    ports = disc.ports
    http = _port(pod, ports.http, ports.http_default)
    events = _port(pod, ports.kv_events, ports.kv_events_default)
    replay = _port(pod, ports.kv_replay, ports.kv_replay_default)
    restarts = sum(s.restart_count or 0 for s in pod.status.container_statuses or [])
    use_events = pool.engine.kv_events
    return EndpointSpec(
        id=f"{pod.metadata.namespace}/{pod.metadata.name}",
        pool=pool.key,
        url=f"{disc.scheme}://{host}:{http}",
        kv_events=f"tcp://{host}:{events}" if use_events else None,
        kv_replay=f"tcp://{host}:{replay}" if use_events else None,
        kv_topic=kv_topic(ip, pool.model),
        generation=f"{pod.metadata.uid}:{restarts}",
    )


async def _load_kube_config() -> None:
    from kubernetes_asyncio import config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config()


class KubernetesPodDiscovery:
    def __init__(self, pool: PoolConfig, endpoints: EndpointSet) -> None:
        assert pool.endpoints.kubernetes is not None
        self.pool = pool
        self._disc = pool.endpoints.kubernetes
        self._namespace = self._disc.namespace or pool.namespace
        self._endpoints = endpoints
        self._task: asyncio.Task[None] | None = None
        self._pods: dict[str, Any] = {}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kvgate-discovery-{self.pool.key}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _publish(self) -> None:
        specs = [
            pod_spec(self.pool, self._disc, pod) for pod in self._pods.values() if pod_is_ready(pod)
        ]
        await self._endpoints.replace_pool(self.pool.key, specs)

    async def _run(self) -> None:
        from kubernetes_asyncio import client, watch
        from kubernetes_asyncio.client.exceptions import ApiException

        backoff = 0.2
        while True:
            try:
                await _load_kube_config()
                break
            except Exception as exc:  # no kubeconfig / service account yet: keep trying
                log.warning("no Kubernetes client configuration for %s: %r", self.pool.key, exc)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
        async with client.ApiClient() as api_client:
            api = client.CoreV1Api(api_client)
            backoff = 0.2
            while True:
                try:
                    listing = await api.list_namespaced_pod(
                        self._namespace, label_selector=self._disc.label_selector
                    )
                    self._pods = {p.metadata.name: p for p in listing.items}
                    await self._publish()
                    version = listing.metadata.resource_version
                    backoff = 0.2
                    stream = watch.Watch().stream(
                        api.list_namespaced_pod,
                        self._namespace,
                        label_selector=self._disc.label_selector,
                        resource_version=version,
                        timeout_seconds=300,
                    )
                    async for event in stream:
                        pod = event["object"]
                        if event["type"] == "DELETED":
                            self._pods.pop(pod.metadata.name, None)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._pods[pod.metadata.name] = pod
                        else:
                            continue
                        await self._publish()
                except asyncio.CancelledError:
                    raise
                except ApiException as exc:
                    if exc.status != 410:
                        log.warning("pod watch for %s failed: %s", self.pool.key, exc)
                except Exception as exc:
                    log.warning("pod watch for %s broke: %r", self.pool.key, exc)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
