"""The e2e harness: a real control plane (hack/cluster) in a private network namespace.

``Cluster.start()`` runs hack/cluster/up.sh with a namespace and state directory of its own
(``kvgate-e2e-<pid>``), then moves this process's main thread into that network namespace
(``setns``), so the tests, and every subprocess they start (kubectl, helm, kvgate), reach the
API server at 127.0.0.1:6443 and every pod at its pod IP. ``stop()`` moves the thread back and
runs down.sh. See tests/e2e/README.md for the fixtures built on it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "cluster"
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def environment_problem() -> str | None:
    """Why this machine cannot run the e2e suite, or None when it can."""
    if sys.platform != "linux":
        return "the e2e cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return (
            "the e2e cluster needs root (it creates a network namespace); run as root, as CI does"
        )
    for tool in ("ip", "openssl", "setsid"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs it)"
    if shutil.which("go") is None and not (built_bin_dir() / "kvgate-cluster").exists():
        return "Go is not installed and the control plane is not built (make cluster-build)"
    return None


def built_bin_dir() -> Path:
    out = subprocess.run(
        ["bash", str(HACK / "build.sh"), "--print-bindir"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return Path(out.stdout.strip())


def build() -> Path:
    """Build the control plane if needed (minutes when cold, instant when cached)."""
    subprocess.run(["bash", str(HACK / "build.sh")], check=True, timeout=3600)
    return built_bin_dir()


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


class Cluster:
    """A running e2e cluster; tests use it through the fixtures in conftest.py."""

    def __init__(self, nodes: int = 2, external_kubeconfig: Path | None = None) -> None:
        self.netns = f"kvgate-e2e-{os.getpid()}"
        self.state_dir = Path(tempfile.mkdtemp(prefix="kvgate-e2e-"))
        # An external cluster (hack/kind-e2e.sh): nothing to start or stop, real kubelets.
        self.external = external_kubeconfig is not None
        self.kubeconfig = external_kubeconfig or self.state_dir / "kubeconfig"
        self.bin_dir = (
            built_bin_dir()
            if not self.external
            else Path(shutil.which("kubectl") or "/usr/bin/kubectl").parent
        )
        self.kvgate = str(Path(sys.executable).parent / "kvgate")
        self.nodes = nodes
        self._host_netns: int | None = None
        self.env = dict(os.environ)
        self.env.update(
            KVGATE_CLUSTER_NETNS=self.netns,
            KVGATE_CLUSTER_DIR=str(self.state_dir),
            KVGATE_CLUSTER_NODES=str(nodes),
            KVGATE_BIN=self.kvgate,
            KUBECONFIG=str(self.kubeconfig),
            PATH=f"{self.bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        )

    def start(self) -> None:
        if self.external:
            self.nodes = len(self.get("nodes")["items"])
            return
        subprocess.run(["bash", str(HACK / "up.sh")], env=self.env, check=True, timeout=300)
        self._host_netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)

    def stop(self, keep_state: bool = False) -> None:
        if self._host_netns is not None:
            _setns(self._host_netns)
            os.close(self._host_netns)
            self._host_netns = None
        if not self.external:
            subprocess.run(["bash", str(HACK / "down.sh")], env=self.env, check=False, timeout=120)
        if not keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # --- helpers for tests -------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's own kubectl (same release as the API server)."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def get(self, *args: str) -> Any:
        """``kubectl get ... -o json`` as a Python object."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: str, namespace: str | None = None) -> str:
        ns = ["-n", namespace] if namespace else []
        return self.kubectl("apply", *ns, "-f", "-", input=manifest).stdout

    def pod_logs(self, namespace: str, pod: str) -> str:
        """The container logs the pod runner wrote for a pod (all containers, all restarts)."""
        if self.external:
            logs = self.kubectl("logs", "-n", namespace, pod, "--all-containers", check=False)
            previous = self.kubectl(
                "logs", "-n", namespace, pod, "--all-containers", "--previous", check=False
            )
            return previous.stdout + previous.stderr + logs.stdout + logs.stderr
        text = []
        for path in sorted((self.state_dir / "pods").glob(f"{namespace}_{pod}_*/logs/*.log")):
            text.append(f"==> {path.name} <==\n{path.read_text(errors='replace')}")
        return "\n".join(text)

    def component_log(self, name: str) -> str:
        """A control-plane component's log (etcd, kube-apiserver, kwok, podrunner, ...)."""
        path = self.state_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def diagnose(self, namespace: str) -> str:
        """What a failed test should print: the namespace's workloads, pods and events, each
        pod's container logs, and the pod runner's log tail."""
        parts = []
        for what in ("statefulsets,deployments,pods,pvc", "events"):
            result = self.kubectl("get", what, "-n", namespace, "-o", "wide", check=False)
            parts.append(f"$ kubectl get {what}\n{result.stdout}{result.stderr}")
        pods = self.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout
        for name in pods.split():
            parts.append(
                f"--- logs of {name}\n{self.pod_logs(namespace, name.partition('/')[2])[-1500:]}"
            )
        if not self.external:
            parts.append(f"--- podrunner log tail\n{self.component_log('podrunner')[-3000:]}")
        return "\n".join(parts)


def wait_until(
    condition: Callable[[], T | None], timeout: float = 60, interval: float = 0.3, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what or condition}: {last!r}"
    )


def pod_ready(pod: dict[str, Any]) -> bool:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return bool(condition["status"] == "True")
    return False


def ready_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = cluster.get("pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]


# Images the tests deploy. On the network-namespace cluster any name works (the pod runner
# maps names containing "vllm"/"kvgate"/"redis" to local programs); hack/kind-e2e.sh builds and
# loads real images under these names.
KVGATE_IMAGE = os.environ.get("KVGATE_E2E_IMAGE", "kvgate:e2e")
VLLM_IMAGE = os.environ.get("KVGATE_E2E_VLLM_IMAGE", "vllm/vllm-openai:kvgate-sim")
