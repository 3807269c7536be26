"""The pod runner: a process kubelet for KWOK nodes.

It lists the nodes KWOK manages (annotation ``kwok.x-k8s.io/node=fake``), then watches every
pod (list + watch from the list's resourceVersion; a broken or expired watch lists again). For
each pod on one of those nodes:

- phase ``Running`` with a pod IP (KWOK's stage sets both, and leaves the pod not Ready) and no
  ``deletionTimestamp`` → a ``PodWorker`` starts its containers and reports readiness;
- ``deletionTimestamp`` set → the worker stops the processes within the pod's grace period, then
  the runner deletes the pod with grace 0, as a kubelet does once its containers are gone;
- the pod disappears (DELETED, or absent from a new list) → its processes are stopped.

On shutdown every process is stopped. The runner only writes pod status and deletes pods
whose deletion was requested; it never creates anything but service-account tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kvgate.podrunner.pod import PodWorker

log = logging.getLogger(__name__)

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
MAX_GRACE_SECONDS = 30.0
WATCH_TIMEOUT_SECONDS = 240


@dataclass(frozen=True)
class RunnerConfig:
    state_dir: Path
    kvgate: str
    api_server: str  # as the pods reach it (from their own network namespaces)
    ca_cert: bytes
    host_ip: str  # the cluster namespace's address: the pods' default gateway


class PodRunner:
    """Watches pods on KWOK nodes and runs them as local processes."""

    def __init__(self, api: client.ApiClient, config: RunnerConfig) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._config = config
        self._workers: dict[str, PodWorker] = {}  # pod uid -> worker
        self._stopping: set[str] = set()  # uids being terminated
        self._nodes: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Run until cancelled; stops every pod process on the way out."""
        try:
            while True:
                try:
                    await self._list_and_watch()
                except ApiException as exc:
                    if exc.status != 410:
                        log.warning("watch failed: %s %s; listing again", exc.status, exc.reason)
                        await asyncio.sleep(1)
                except (TimeoutError, OSError) as exc:
                    log.warning("API unreachable: %s; retrying", exc)
                    await asyncio.sleep(1)
        finally:
            await self.shutdown()

    async def _refresh_nodes(self) -> None:
        nodes = await self._core.list_node()
        key, value = KWOK_NODE_ANNOTATION
        self._nodes = {
            node.metadata.name
            for node in nodes.items
            if (node.metadata.annotations or {}).get(key) == value
        }

    async def _list_and_watch(self) -> None:
        await self._refresh_nodes()
        listing = await self._core.list_pod_for_all_namespaces()
        seen: set[str] = set()
        for item in listing.items:
            pod = self._api.sanitize_for_serialization(item)
            seen.add(pod["metadata"]["uid"])
            await self._handle("MODIFIED", pod)
        for uid in list(self._workers):
            if uid not in seen:
                self._terminate(uid, grace_seconds=0, delete=False)
        stream = watch.Watch()
        async with stream:
            async for event in stream.stream(
                self._core.list_pod_for_all_namespaces,
                resource_version=listing.metadata.resource_version,
                timeout_seconds=WATCH_TIMEOUT_SECONDS,
                allow_watch_bookmarks=True,
            ):
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    pod = self._api.sanitize_for_serialization(event["object"])
                    await self._handle(event["type"], pod)

    async def _handle(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        uid = str(meta["uid"])
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        if node not in self._nodes:
            await self._refresh_nodes()
            if node not in self._nodes:
                return
        grace = min(
            float((pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30),
            MAX_GRACE_SECONDS,
        )
        if kind == "DELETED":
            self._terminate(uid, grace_seconds=min(grace, 2.0), delete=False)
            return
        if meta.get("deletionTimestamp"):
            self._terminate(uid, grace_seconds=grace, delete=True, pod=pod)
            return
        status = pod.get("status") or {}
        if uid in self._workers or status.get("phase") != "Running" or not status.get("podIP"):
            return
        worker = PodWorker(
            self._core,
            pod,
            pod_dir=self._config.state_dir / f"{meta['namespace']}_{meta['name']}_{uid[:8]}",
            kvgate=self._config.kvgate,
            api_server=self._config.api_server,
            ca_cert=self._config.ca_cert,
            host_ip=self._config.host_ip,
        )
        self._workers[uid] = worker
        log.info("starting pod %s on %s (ip %s)", worker.key, node, status["podIP"])
        worker.start()

    def _terminate(
        self,
        uid: str,
        *,
        grace_seconds: float,
        delete: bool,
        pod: Mapping[str, Any] | None = None,
    ) -> None:
        if uid in self._stopping:
            return
        if uid not in self._workers and not (delete and pod is not None):
            return
        self._stopping.add(uid)
        task = asyncio.create_task(self._stop_pod(uid, grace_seconds, delete, pod))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_pod(
        self, uid: str, grace_seconds: float, delete: bool, pod: Mapping[str, Any] | None
    ) -> None:
        try:
            worker = self._workers.get(uid)
            if worker is not None:
                log.info("stopping pod %s (grace %.0f s)", worker.key, grace_seconds)
                await worker.stop(grace_seconds)
            if delete and pod is not None:
                meta = pod["metadata"]
                with contextlib.suppress(ApiException):
                    await self._core.delete_namespaced_pod(
                        meta["name"],
                        meta["namespace"],
                        grace_period_seconds=0,
                        body=client.V1DeleteOptions(
                            grace_period_seconds=0,
                            preconditions=client.V1Preconditions(uid=uid),
                        ),
                    )
            if worker is not None:
                shutil.rmtree(
                    self._config.state_dir
                    / f"{worker.namespace}_{worker.name}_{uid[:8]}"
                    / "volumes",
                    ignore_errors=True,
                )
        finally:
            self._workers.pop(uid, None)
            self._stopping.discard(uid)

    async def shutdown(self) -> None:
        """Stop every pod process (used on exit)."""
        for uid in list(self._workers):
            self._terminate(uid, grace_seconds=5.0, delete=False)
        background = list(self._background)
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
