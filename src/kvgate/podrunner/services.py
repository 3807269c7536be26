"""Services for the pods of the test cluster: a small userspace kube-proxy and a hosts file.

The test cluster has no kube-proxy and no cluster DNS. Every ``RESYNC_SECONDS`` the runner lists
Services and EndpointSlices and reconciles:

- **proxy**: for each TCP port of each Service with a ClusterIP, a listener on
  ``ClusterIP:port`` (the service range is routed to lo in the cluster's namespace). Each
  connection goes to a ready endpoint (EndpointSlice ``conditions.ready``) on the matching
  target port, chosen round robin, and bytes are copied both ways until either side closes.
  A connection with no ready endpoint is closed at once (what a client sees as "refused").
- **names**: a hosts file (the namespace's ``/etc/netns/<ns>/hosts``, which ``ip netns exec``
  mounts over ``/etc/hosts`` for the processes it starts, and so for every pod process) maps
  ``<svc>.<ns>.svc.cluster.local``, ``<svc>.<ns>.svc`` and ``<svc>.<ns>`` to the ClusterIP (for
  headless Services: to the first ready endpoint), and the bare ``<svc>`` when only one
  namespace has a Service of that name (hosts files have no search domains). The file is
  rewritten in place, because the mount follows the file, not its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

log = logging.getLogger(__name__)

RESYNC_SECONDS = 1.0
# A connection that finds no ready endpoint waits this long for one (a pod that has just become
# Ready reaches the EndpointSlices a moment later), then is closed, as kube-proxy rejects it.
NO_ENDPOINT_WAIT_SECONDS = 5.0
HOSTS_HEADER = "127.0.0.1 localhost\n::1 localhost\n"


@dataclass
class Listener:
    """One ClusterIP:port and where it forwards to."""

    service: str  # <ns>/<name>
    port_name: str
    backends: list[tuple[str, int]] = field(default_factory=list)
    server: asyncio.Server | None = None
    counter: itertools.count[int] = field(default_factory=itertools.count)
    endpoint_wait_seconds: float = NO_ENDPOINT_WAIT_SECONDS
    _has_backends: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.set_backends(self.backends)

    def set_backends(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        if backends:
            self._has_backends.set()
        else:
            self._has_backends.clear()

    def pick(self) -> tuple[str, int] | None:
        if not self.backends:
            return None
        return self.backends[next(self.counter) % len(self.backends)]

    async def wait_and_pick(self) -> tuple[str, int] | None:
        """A backend, waiting up to `endpoint_wait_seconds` for one; None if none came."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.endpoint_wait_seconds):
                await self._has_backends.wait()
        return self.pick()


def ready_backends(slices: list[Mapping[str, Any]], port_name: str) -> list[tuple[str, int]]:
    """(ip, port) of the ready endpoints of a Service port, from its EndpointSlices.

    The EndpointSlice controller names each slice port after the Service port ('' when unnamed)
    and has already resolved named target ports to numbers."""
    backends: list[tuple[str, int]] = []
    for endpoint_slice in slices:
        ports = endpoint_slice.get("ports") or []
        match = [p for p in ports if (p.get("name") or "") == port_name]
        if not match or match[0].get("port") is None:
            continue
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            backends.extend((address, int(match[0]["port"])) for address in endpoint["addresses"])
    return sorted(set(backends))


def hosts_file(services: list[Mapping[str, Any]], headless_ips: Mapping[str, str]) -> str:
    """The hosts file text for these Services."""
    lines = [HOSTS_HEADER]
    by_name: dict[str, set[str]] = defaultdict(set)
    for service in services:
        by_name[service["metadata"]["name"]].add(service["metadata"]["namespace"])
    for service in sorted(
        services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])
    ):
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        ip = service["spec"].get("clusterIP")
        if not ip or ip == "None":
            ip = headless_ips.get(f"{namespace}/{name}")
        if not ip:
            continue
        names = [
            f"{name}.{namespace}.svc.cluster.local",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}",
        ]
        if len(by_name[name]) == 1:
            names.append(name)
        lines.append(f"{ip} {' '.join(names)}\n")
    return "".join(lines)


class ServiceProxy:
    """Keeps listeners and the hosts file in line with the cluster's Services."""

    def __init__(self, api: client.ApiClient, hosts_path: Path | None) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._discovery = client.DiscoveryV1Api(api)
        self._hosts_path = hosts_path
        self._listeners: dict[tuple[str, int], Listener] = {}  # (cluster ip, port) -> listener
        self._connections: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Reconcile every RESYNC_SECONDS until cancelled; then close every listener."""
        try:
            while True:
                try:
                    await self.sync()
                except (client.exceptions.ApiException, OSError) as exc:
                    log.warning("service sync failed: %s", exc)
                await asyncio.sleep(RESYNC_SECONDS)
        finally:
            await self.close()

    async def sync(self) -> None:
        services = [
            self._api.sanitize_for_serialization(s)
            for s in (await self._core.list_service_for_all_namespaces()).items
        ]
        slices_by_service: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for item in (await self._discovery.list_endpoint_slice_for_all_namespaces()).items:
            endpoint_slice = self._api.sanitize_for_serialization(item)
            owner = (endpoint_slice["metadata"].get("labels") or {}).get(
                "kubernetes.io/service-name"
            )
            if owner:
                slices_by_service[f"{endpoint_slice['metadata']['namespace']}/{owner}"].append(
                    endpoint_slice
                )
        wanted: dict[tuple[str, int], Listener] = {}
        headless: dict[str, str] = {}
        for service in services:
            key = f"{service['metadata']['namespace']}/{service['metadata']['name']}"
            ip = service["spec"].get("clusterIP")
            for port in service["spec"].get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                backends = ready_backends(slices_by_service[key], port.get("name") or "")
                if not ip or ip == "None":
                    if backends:
                        headless.setdefault(key, backends[0][0])
                    continue
                listener = Listener(key, port.get("name") or "", backends)
                wanted[(ip, int(port["port"]))] = listener
        await self._reconcile(wanted)
        if self._hosts_path is not None:
            self._write_hosts(hosts_file(services, headless))

    async def _reconcile(self, wanted: dict[tuple[str, int], Listener]) -> None:
        for address in list(self._listeners):
            if address not in wanted:
                await self._close_listener(self._listeners.pop(address))
        for address, listener in wanted.items():
            current = self._listeners.get(address)
            if current is not None:
                current.set_backends(listener.backends)
                continue
            try:
                listener.server = await asyncio.start_server(
                    functools.partial(self._accept, listener), address[0], address[1]
                )
            except OSError as exc:
                log.warning("cannot listen on %s:%s for %s: %s", *address, listener.service, exc)
                continue
            self._listeners[address] = listener
            log.info("service %s on %s:%s", listener.service, *address)

    def _accept(
        self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.create_task(self._forward(listener, reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _forward(
        self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        backend = await listener.wait_and_pick()
        try:
            if backend is None:
                raise ConnectionRefusedError(f"no ready endpoint for {listener.service}")
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*backend), 5)
        except (OSError, TimeoutError):
            writer.close()
            return
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    def _write_hosts(self, text: str) -> None:
        assert self._hosts_path is not None
        data = text.encode()
        with self._hosts_path.open("r+b") as hosts:
            if hosts.read() == data:
                return
            hosts.seek(0)
            hosts.write(data)
            hosts.truncate()

    async def _close_listener(self, listener: Listener) -> None:
        if listener.server is not None:
            listener.server.close()  # stops accepting; open connections end with their peers

    async def close(self) -> None:
        for listener in self._listeners.values():
            await self._close_listener(listener)
        self._listeners.clear()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
