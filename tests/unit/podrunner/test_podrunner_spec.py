"""The pure container → process mapping of the pod runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgate.podrunner.pod import status_patch
from kvgate.podrunner.process import ContainerState
from kvgate.podrunner.spec import (
    MissingReference,
    expand_vars,
    image_kind,
    process_spec,
    resolve_env,
    rewrite_paths,
)

KVGATE = "/venv/bin/kvgate"


def make_pod(container: dict[str, Any], ip: str = "10.244.0.7") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "pool-a-0",
            "namespace": "ml",
            "uid": "u-1",
            "labels": {"app": "pool-a"},
        },
        "spec": {"nodeName": "kwok-node-0", "containers": [container]},
        "status": {"podIP": ip, "hostIP": "10.245.0.1", "phase": "Running"},
    }


@pytest.mark.parametrize(
    ("image", "kind"),
    [
        ("vllm/vllm-openai:v0.11.0", "vllm"),
        ("registry.example.com:5000/team/vllm-tpu@sha256:abc", "vllm"),
        ("ghcr.io/kvgate/kvgate:0.1.0", "kvgate"),
        ("redis:7", "redis"),
        ("docker.io/bitnami/redis", "redis"),
        ("prom/prometheus", "none"),
    ],
)
def test_image_kind(image: str, kind: str) -> None:
    assert image_kind(image) == kind


def test_vllm_container_runs_the_simulator_with_its_own_flags() -> None:
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve"],
        "args": [
            "Qwen/Qwen3-0.6B",
            "--port",
            "8000",
            "--kv-events-config",
            '{"endpoint": "tcp://*:5557", "topic": "kv@$(POD_IP)@m"}',
        ],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
    spec = process_spec(
        make_pod(container), container, refs={}, mounts={}, kvgate=KVGATE, base_env={}
    )
    # Flags are passed as the pod says (its own network namespace: `tcp://*` binds there).
    assert spec.argv == [
        KVGATE,
        "sim",
        "serve",
        "Qwen/Qwen3-0.6B",
        "--port",
        "8000",
        "--kv-events-config",
        '{"endpoint": "tcp://*:5557", "topic": "kv@10.244.0.7@m"}',
    ]
    assert spec.env["POD_IP"] == "10.244.0.7"


def test_python_module_entrypoint_is_stripped() -> None:
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai",
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": ["--model", "m", "--host=0.0.0.0"],
    }
    spec = process_spec(
        make_pod(container), container, refs={}, mounts={}, kvgate=KVGATE, base_env={}
    )
    assert spec.argv == [KVGATE, "sim", "serve", "--model", "m", "--host=0.0.0.0"]


def test_kvgate_container_config_path_is_mapped_to_the_volume() -> None:
    container = {
        "name": "router",
        "image": "ghcr.io/kvgate/kvgate:0.1.0",
        "command": ["kvgate"],
        "args": ["router", "--config=/etc/kvgate/router.yaml", "--host", "0.0.0.0"],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/kvgate"}],
    }
    mounts = {"/etc/kvgate": Path("/state/pod/volumes/config")}
    spec = process_spec(
        make_pod(container),
        container,
        refs={},
        mounts=mounts,
        kvgate=KVGATE,
        base_env={"PATH": "/bin"},
    )
    assert spec.argv == [
        KVGATE,
        "router",
        "--config=/state/pod/volumes/config/router.yaml",
        "--host",
        "0.0.0.0",
    ]
    assert spec.env == {"PATH": "/bin"}


def test_redis_runs_redis_server_without_snapshots() -> None:
    container = {
        "name": "redis",
        "image": "redis:7",
        "args": ["--maxmemory", "64mb"],
        "ports": [{"name": "redis", "containerPort": 6380}],
    }
    spec = process_spec(
        make_pod(container), container, refs={}, mounts={}, kvgate=KVGATE, base_env={}
    )
    assert spec.argv[0] == "redis-server"
    assert spec.argv[1:] == ["--maxmemory", "64mb", "--protected-mode", "no", "--save", ""]
    assert spec.ports == {"redis": 6380}


def test_env_resolution_order_refs_and_expansion() -> None:
    container = {
        "name": "c",
        "image": "x",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "URL", "value": "http://$(APP).$(NS):$(CM_PORT)/$(UNKNOWN)$$"},
        ],
    }
    refs = {("configmap", "cm"): {"PORT": "80"}, ("secret", "s"): {"k": "v"}}
    env = resolve_env(make_pod(container), container, refs)
    assert env == {
        "CM_PORT": "80",
        "NS": "ml",
        "APP": "pool-a",
        "KEY": "v",
        "URL": "http://pool-a.ml:80/$(UNKNOWN)$",
    }


def test_missing_secret_key_is_an_error_unless_optional() -> None:
    container = {
        "name": "c",
        "image": "x",
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    with pytest.raises(MissingReference):
        resolve_env(make_pod(container), container, {})
    container["env"][0]["valueFrom"]["secretKeyRef"]["optional"] = True
    assert resolve_env(make_pod(container), container, {}) == {}


def test_rewrites_are_anchored() -> None:
    mounts = {"/etc/kvgate": Path("/l/cfg"), "/etc/kvgate/tls": Path("/l/tls")}
    assert rewrite_paths("/etc/kvgate/tls/ca.crt", mounts) == "/l/tls/ca.crt"
    assert rewrite_paths("/etc/kvgatex/a", mounts) == "/etc/kvgatex/a"
    assert rewrite_paths("--x=/etc/kvgate", mounts) == "--x=/l/cfg"
    assert rewrite_paths("a/etc/kvgate/b", mounts) == "a/etc/kvgate/b"
    assert expand_vars("$(A)-$(B)", {"A": "1"}) == "1-$(B)"


def test_status_patch_is_ready_only_when_every_container_is() -> None:
    ready = ContainerState(ready=True, running=True, started_at="t")
    crashed = ContainerState(restart_count=2, last_exit_code=2, waiting_reason="CrashLoopBackOff")
    patch = status_patch([("i", "a", ready), ("i", "b", crashed)], previous_ready=None)
    conditions = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert "lastTransitionTime" in conditions["Ready"]
    statuses = patch["status"]["containerStatuses"]
    assert statuses[0]["state"]["running"] == {"startedAt": "t"}
    assert statuses[1]["state"] == {
        "waiting": {"reason": "CrashLoopBackOff"},
        "running": None,
        "terminated": None,
    }
    assert statuses[1]["lastState"]["terminated"]["exitCode"] == 2
    same = status_patch([("i", "a", ready)], previous_ready=True)
    assert all("lastTransitionTime" not in c for c in same["status"]["conditions"])
