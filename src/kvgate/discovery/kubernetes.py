"""Discover a pool's ready engine pods from the EndpointSlices of its Service.

Kubernetes' EndpointSlice controller keeps, for every Service with a selector, slices
(`discovery.k8s.io/v1`) listing the selected pods with their addresses, the Service's ports
resolved to container port numbers, and three conditions. List the Service's slices (label
`kubernetes.io/service-name`), then watch from the list's resourceVersion; every event updates
the slice table and the pool's endpoints are replaced with what the slices say now:

- **ready** endpoints are routed to (`ready` unset counts as true, as the API says);
- **terminating** endpoints leave at once, even while still `serving`: the endpoint set drops
  them, which forgets them in the directory within the 2 s budget. Only when a pool has no ready
  endpoint at all are its serving terminating ones used (what kube-proxy does), so that a rolling
  restart of a one-pod pool does not fail requests;
- **dual stack**: a dual-stack Service has one slice per address family listing the same pods;
  a pod (keyed by its `targetRef` UID) is used once, at the address of `ip_family` if it has
  one, else IPv4, else IPv6. FQDN slices are ignored.

A watch that expires (410 Gone) or breaks is re-listed after a short backoff. The client bounds
both calls itself (`REQUEST_TIMEOUT`: connect, then each read): a connection to an API server
that went silent without closing it (its node died, a partition) otherwise waited forever, and
pods that left stayed routed to. A watch asks the server to end it after `WATCH_SECONDS`,
inside the read bound, so a quiet but live watch ends by the server's hand and is re-listed.

Endpoint identity is `<namespace>/<pod>` (from `targetRef`; `<namespace>/<address>` for
endpoints that are not pods) and the generation is the pod UID: a pod that restarts its engine
goes unready and leaves, and the engine's KV-event seq reset clears it besides. Ports are looked
up by name on the slice (`http`, `kv-events`, `kv-replay` by default), else the documented
defaults. KV events are expected under the topic the operator renders, `kv@<pod IP>@<model>`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvgate.api.router_config import KubernetesDiscovery, PoolConfig
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec, kv_topic
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
WATCH_SECONDS = 60
REQUEST_TIMEOUT = (10.0, WATCH_SECONDS + 15.0)  # seconds: connect, each read
IP_FAMILIES = ("IPv4", "IPv6")


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    """One endpoint of one slice, with what routing needs of it."""

    id: str
    generation: str
    address: str
    ports: dict[str, int]
    ready: bool
    serving: bool
    terminating: bool


def _port(ports: dict[str, int], name: str, default: int) -> int:
    if name.isdigit():
        return int(name)
    return ports.get(name, default)


def slice_endpoints(endpoint_slice: Any) -> list[SliceEndpoint]:
    """The endpoints of one EndpointSlice (IPv4/IPv6 only), conditions defaulted as the API says:
    ready unset = true, serving unset = ready, terminating unset = false."""
    if endpoint_slice.address_type not in IP_FAMILIES:
        return []
    namespace = endpoint_slice.metadata.namespace
    ports = {p.name or "": int(p.port) for p in endpoint_slice.ports or [] if p.port is not None}
    found = []
    for endpoint in endpoint_slice.endpoints or []:
        if not endpoint.addresses:
            continue
        address = endpoint.addresses[0]
        ref = endpoint.target_ref
        is_pod = ref is not None and ref.kind == "Pod" and ref.name
        conditions = endpoint.conditions
        ready = conditions is None or conditions.ready is not False
        serving = ready if conditions is None or conditions.serving is None else conditions.serving
        terminating = conditions is not None and conditions.terminating is True
        found.append(
            SliceEndpoint(
                id=f"{ref.namespace or namespace}/{ref.name}"
                if is_pod
                else f"{namespace}/{address}",
                generation=(ref.uid or address) if is_pod else address,
                address=address,
                ports=ports,
                ready=ready and not terminating,
                serving=serving,
                terminating=terminating,
            )
        )
    return found


def routable_endpoints(
    slices: Iterable[Any], ip_family: str | None = None
) -> list[tuple[str, SliceEndpoint]]:
    """`(family, endpoint)` per pod to route to: the ready ones, else the serving terminating
    ones; one address family per pod (`ip_family`, else IPv4, else IPv6)."""
    by_pod: dict[str, dict[str, SliceEndpoint]] = {}
    for endpoint_slice in slices:
        for endpoint in slice_endpoints(endpoint_slice):
            by_pod.setdefault(endpoint.id, {})[endpoint_slice.address_type] = endpoint
    preference = [ip_family] if ip_family else []
    preference += [f for f in IP_FAMILIES if f not in preference]
    picked = []
    for families in by_pod.values():
        family = next(f for f in preference if f in families)
        picked.append((family, families[family]))
    ready = [(f, e) for f, e in picked if e.ready]
    if ready:
        return ready
    return [(f, e) for f, e in picked if e.serving and e.terminating]


def endpoint_spec(
    pool: PoolConfig, disc: KubernetesDiscovery, family: str, endpoint: SliceEndpoint
) -> EndpointSpec:
    host = f"[{endpoint.address}]" if family == "IPv6" else endpoint.address
    ports = disc.ports
    http = _port(endpoint.ports, ports.http, ports.http_default)
    events = _port(endpoint.ports, ports.kv_events, ports.kv_events_default)
    replay = _port(endpoint.ports, ports.kv_replay, ports.kv_replay_default)
    use_events = pool.engine.kv_events
    return EndpointSpec(
        id=endpoint.id,
        pool=pool.key,
        url=f"{disc.scheme}://{host}:{http}",
        kv_events=f"tcp://{host}:{events}" if use_events else None,
        kv_replay=f"tcp://{host}:{replay}" if use_events else None,
        kv_topic=kv_topic(endpoint.address, pool.model),
        generation=endpoint.generation,
    )


def pool_endpoint_specs(
    pool: PoolConfig, disc: KubernetesDiscovery, slices: Iterable[Any]
) -> list[EndpointSpec]:
    return [
        endpoint_spec(pool, disc, family, endpoint)
        for family, endpoint in routable_endpoints(slices, disc.ip_family)
    ]


async def _load_kube_config() -> None:
    from kubernetes_asyncio import config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config()


class EndpointSliceDiscovery:
    def __init__(self, pool: PoolConfig, endpoints: EndpointSet) -> None:
        assert pool.endpoints.kubernetes is not None
        self.pool = pool
        self._disc = pool.endpoints.kubernetes
        self._namespace = self._disc.namespace or pool.namespace
        self._selector = f"{SERVICE_NAME_LABEL}={self._disc.service}"
        self._endpoints = endpoints
        self._task: asyncio.Task[None] | None = None
        self._slices: dict[str, Any] = {}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kvgate-discovery-{self.pool.key}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _publish(self) -> None:
        specs = pool_endpoint_specs(self.pool, self._disc, self._slices.values())
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
            api = client.DiscoveryV1Api(api_client)
            backoff = 0.2
            while True:
                try:
                    listing = await api.list_namespaced_endpoint_slice(
                        self._namespace,
                        label_selector=self._selector,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                    self._slices = {s.metadata.name: s for s in listing.items}
                    await self._publish()
                    version = listing.metadata.resource_version
                    backoff = 0.2
                    stream = watch.Watch().stream(
                        api.list_namespaced_endpoint_slice,
                        self._namespace,
                        label_selector=self._selector,
                        resource_version=version,
                        timeout_seconds=WATCH_SECONDS,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                    async for event in stream:
                        endpoint_slice = event["object"]
                        if event["type"] == "DELETED":
                            self._slices.pop(endpoint_slice.metadata.name, None)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._slices[endpoint_slice.metadata.name] = endpoint_slice
                        else:
                            continue
                        await self._publish()
                except asyncio.CancelledError:
                    raise
                except ApiException as exc:
                    if exc.status != 410:
                        log.warning("EndpointSlice watch for %s failed: %s", self.pool.key, exc)
                except Exception as exc:
                    log.warning("EndpointSlice watch for %s broke: %r", self.pool.key, exc)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
