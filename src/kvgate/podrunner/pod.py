"""One running pod: its volumes, one process per container, and its status in the API.

``PodWorker.start()`` writes the pod's volumes and credentials, creates the pod's network
namespace (sandbox.py), resolves each container into a ``ProcessSpec`` and supervises a
``ContainerProcess`` per container, entered into that namespace. A single status task owns
all writes of this pod's status: whenever a container changes state it patches the
``Ready``/``ContainersReady`` conditions and ``containerStatuses`` (strategic merge; only when
something changed). The same task refreshes ConfigMap/Secret volumes every
``REFRESH_SECONDS``. When the containers cannot be configured yet (a referenced ConfigMap or
Secret is missing) the containers wait with reason ``CreateContainerConfigError`` and the
worker retries. ``stop()`` stops every process (SIGTERM, grace period, SIGKILL), the tasks and the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kvgate.podrunner.process import ContainerProcess, ContainerState, now_rfc3339
from kvgate.podrunner.sandbox import PodSandbox, SandboxError
from kvgate.podrunner.spec import MissingReference, env_refs, process_spec
from kvgate.podrunner.volumes import PodVolumes

log = logging.getLogger(__name__)

REFRESH_SECONDS = 2.0
# The environment every container starts from (the rest of ours is not the pod's business).
BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")


def container_status(image: str, name: str, state: ContainerState) -> dict[str, Any]:
    """The ``containerStatuses`` entry of one container (``None`` values delete stale keys)."""
    current: dict[str, Any]
    if state.running:
        current = {"running": {"startedAt": state.started_at}, "waiting": None, "terminated": None}
    else:
        current = {"waiting": {"reason": state.waiting_reason}, "running": None, "terminated": None}
    status: dict[str, Any] = {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": state.ready,
        "started": state.running,
        "restartCount": state.restart_count,
        "state": current,
    }
    if state.last_exit_code is not None:
        status["lastState"] = {
            "terminated": {
                "exitCode": state.last_exit_code,
                "reason": "Error" if state.last_exit_code else "Completed",
                "finishedAt": state.last_finished_at,
            }
        }
    return status


def status_patch(
    containers: list[tuple[str, str, ContainerState]], previous_ready: bool | None
) -> dict[str, Any]:
    """A strategic-merge patch of the pod status for these container states."""
    ready = all(state.ready for _image, _name, state in containers)
    reason = None if ready else "ContainersNotReady"
    conditions = []
    for kind in ("ContainersReady", "Ready"):
        condition: dict[str, Any] = {
            "type": kind,
            "status": "True" if ready else "False",
            "reason": reason,
        }
        if previous_ready is None or previous_ready != ready:
            condition["lastTransitionTime"] = now_rfc3339()
        conditions.append(condition)
    return {
        "status": {
            "conditions": conditions,
            "containerStatuses": [container_status(*item) for item in containers],
        }
    }


class PodWorker:
    """Runs one pod's containers as local processes and reports their state."""

    def __init__(
        self,
        core: client.CoreV1Api,
        pod: Mapping[str, Any],
        *,
        pod_dir: Path,
        kvgate: str,
        api_server: str,
        ca_cert: bytes,
        host_ip: str,
    ) -> None:
        self._core = core
        self.pod = pod
        self.name = str(pod["metadata"]["name"])
        self.namespace = str(pod["metadata"]["namespace"])
        self._dir = pod_dir
        self._kvgate = kvgate
        self._volumes = PodVolumes(core, pod, pod_dir, api_server=api_server, ca_cert=ca_cert)
        self._processes: list[ContainerProcess] = []
        self._process_tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._last_patch: dict[str, Any] | None = None
        self._last_ready: bool | None = None
        self._task: asyncio.Task[None] | None = None
        self._sandbox = PodSandbox(
            str(pod["status"]["podIP"]),
            host_ip,
            str(pod["metadata"]["uid"]),
            pid_file=pod_dir / "sandbox.pid",
        )
        self._sandbox_ready = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"pod-{self.key}")

    async def _run(self) -> None:
        while True:
            try:
                await self._start_containers()
                break
            except (MissingReference, ApiException, SandboxError) as exc:
                log.warning("pod %s cannot start yet: %s", self.key, exc)
                await self._report_waiting("CreateContainerConfigError")
                await asyncio.sleep(REFRESH_SECONDS)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REFRESH_SECONDS)
            self._changed.clear()
            try:
                await self._volumes.refresh()
                await self._report()
            except ApiException as exc:
                if exc.status == 404:
                    return  # the pod is gone; the runner stops us
                log.warning("pod %s: status update failed: %s", self.key, exc.reason)

    async def _start_containers(self) -> None:
        await self._volumes.write_all()
        if not self._sandbox_ready:
            await self._sandbox.create()
            self._sandbox_ready = True
        base_env = {k: v for k, v in os.environ.items() if k in BASE_ENV_NAMES}
        pod_ip = str(self.pod["status"]["podIP"])
        specs = []
        for container in self.pod["spec"]["containers"]:
            refs: dict[tuple[str, str], Mapping[str, str]] = {}
            for kind, ref_name in env_refs(container):
                values = await self._volumes.source_values(kind, ref_name)
                if values is not None:
                    refs[(kind, ref_name)] = values
            env = dict(base_env)
            if self._volumes.kubeconfig is not None:
                env["KUBECONFIG"] = str(self._volumes.kubeconfig)
            spec = process_spec(
                self.pod,
                container,
                refs=refs,
                mounts=self._volumes.mounts(container),
                kvgate=self._kvgate,
                base_env=env,
            )
            specs.append((container, spec))
        for container, spec in specs:
            log.info("pod %s container %s: %s", self.key, spec.container, " ".join(spec.argv))
            if spec.argv:
                # An image's working directory does not exist here: each container gets its own.
                cwd = spec.cwd or self._dir / "work" / spec.container
                cwd.mkdir(parents=True, exist_ok=True)
                spec = dataclasses.replace(spec, argv=self._sandbox.enter(spec.argv), cwd=cwd)
            process = ContainerProcess(
                spec,
                pod_ip=pod_ip,
                probe=container.get("readinessProbe"),
                log_path=self._dir / "logs" / f"{spec.container}.log",
                on_change=self._changed.set,
            )
            self._processes.append(process)
            self._process_tasks.append(
                asyncio.create_task(process.run(), name=f"container-{self.key}-{spec.container}")
            )

    async def _report_waiting(self, reason: str) -> None:
        states = []
        for container in self.pod["spec"]["containers"]:
            states.append(
                (container["image"], container["name"], ContainerState(waiting_reason=reason))
            )
        with contextlib.suppress(ApiException):
            await self._patch(status_patch(states, self._last_ready))

    async def _report(self) -> None:
        states = [
            (str(c["image"]), str(c["name"]), p.state)
            for c, p in zip(self.pod["spec"]["containers"], self._processes, strict=True)
        ]
        patch = status_patch(states, self._last_ready)
        comparable = _without_times(patch)
        if comparable == self._last_patch:
            return
        await self._patch(patch)
        self._last_patch = comparable
        self._last_ready = all(state.ready for _i, _n, state in states)
        log.info("pod %s ready=%s", self.key, self._last_ready)

    async def _patch(self, body: dict[str, Any]) -> None:
        await self._core.patch_namespaced_pod_status(self.name, self.namespace, body)

    async def stop(self, grace_seconds: float) -> None:
        """Stop every container process, then this worker's tasks."""
        await asyncio.gather(*(p.stop(grace_seconds) for p in self._processes))
        tasks = [*self._process_tasks, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._sandbox.destroy()

    def log_paths(self) -> list[Path]:
        return [self._dir / "logs" / f"{p.spec.container}.log" for p in self._processes]


def _without_times(patch: dict[str, Any]) -> dict[str, Any]:
    status = patch["status"]
    return {
        "conditions": [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
        ],
        "containerStatuses": status["containerStatuses"],
    }
