"""A pod's own network namespace, wired to the cluster namespace like the CNI ``ptp`` plugin.

Each pod gets a sandbox, as a kubelet's pause container gives it: a ``sleep`` process started
under ``unshare --net`` holds a fresh network namespace; a veth pair joins it to the cluster's
namespace. Inside, ``eth0`` carries the pod IP (/32), ``lo`` is up, and the default route goes
to the cluster namespace's host address; outside, a /32 route sends the pod IP to the veth. The
cluster namespace forwards between pods (``net.ipv4.ip_forward=1``, set by up.sh) and serves
Service ClusterIPs locally. So every pod has its own ports (two engines can both bind
``tcp://*:5557``) and its own localhost shared by its containers, exactly as on a real node.

Container processes enter the namespace with ``nsenter --net`` (their mount namespace stays the
runner's, so they see the cluster's hosts file). ``destroy()`` kills the holder; the namespace,
the veth pair and the route disappear with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_SECONDS = 10.0


class SandboxError(RuntimeError):
    """The pod's network could not be set up."""


async def _run(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SandboxError(f"{' '.join(argv)}: timed out") from None
    if process.returncode != 0:
        raise SandboxError(f"{' '.join(argv)}: {err.decode(errors='replace').strip()}")


class PodSandbox:
    """The network namespace of one pod."""

    def __init__(self, pod_ip: str, host_ip: str, uid: str, pid_file: Path) -> None:
        self.pod_ip = pod_ip
        self._pid_file = pid_file  # for hack/cluster/down.sh, should the runner be killed
        self._host_ip = host_ip
        self._host_if = f"kv{uid.replace('-', '')[:10]}"  # interface names: at most 15 bytes
        self._holder: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self._holder is not None, "sandbox not created"
        return self._holder.pid

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the pod's network namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", *argv]

    async def create(self) -> None:
        self._holder = await asyncio.create_subprocess_exec(
            "unshare",
            "--net",
            "--",
            "sleep",
            "infinity",
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        await self._wait_for_new_namespace()
        pid = str(self.pid)
        self._pid_file.parent.mkdir(parents=True, exist_ok=True)
        self._pid_file.write_text(pid)
        try:
            if _link_exists(self._host_if):  # left over from a runner that was killed
                await _run("ip", "link", "del", self._host_if)
            await _run(
                "ip",
                "link",
                "add",
                self._host_if,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                pid,
            )
            await _run("ip", "link", "set", self._host_if, "up")
            await _run("ip", "route", "replace", f"{self.pod_ip}/32", "dev", self._host_if)
            inside = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]
            await _run(*inside, "ip", "link", "set", "lo", "up")
            await _run(*inside, "ip", "addr", "add", f"{self.pod_ip}/32", "dev", "eth0")
            await _run(*inside, "ip", "link", "set", "eth0", "up")
            await _run(*inside, "ip", "route", "add", self._host_ip, "dev", "eth0")
            await _run(
                *inside, "ip", "route", "add", "default", "via", self._host_ip, "dev", "eth0"
            )
        except SandboxError:
            await self.destroy()
            raise

    async def _wait_for_new_namespace(self) -> None:
        mine = os.readlink("/proc/self/ns/net")
        for _ in range(200):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.pid}/ns/net") != mine:
                    return
            await asyncio.sleep(0.01)
        raise SandboxError("unshare --net did not create a network namespace")

    async def destroy(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None and holder.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            await holder.wait()
            self._pid_file.unlink(missing_ok=True)
        # The veth pair and its route go with the namespace; this only covers a failed setup.
        if _link_exists(self._host_if):
            with contextlib.suppress(SandboxError):
                await _run("ip", "link", "del", self._host_if)


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")
