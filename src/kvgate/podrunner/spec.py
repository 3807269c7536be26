"""Turn a Kubernetes pod container into a local process: the pure part of the pod runner.

A container becomes an argv, an environment and a working directory:

Each pod runs in a network namespace of its own (sandbox.py), so listen addresses and ports are
left as the pod says.

1. **Image → program.** vLLM images (name contains ``vllm``) run ``kvgate sim serve`` with the
   container's own ``vllm serve`` arguments, so a flag the simulator does not accept fails the
   pod exactly as it would fail vLLM. kvgate images run ``kvgate <args>``. Redis images run a
   real ``redis-server``. Any other image has no program (the container is reported running).
2. **Environment**: ``env`` and ``envFrom`` are resolved as the kubelet does: literal values with
   ``$(VAR)`` expansion, ``fieldRef`` (pod name, namespace, uid, IPs, node, labels, annotations),
   ``configMapKeyRef``/``secretKeyRef`` (from values fetched beforehand), then ``$(VAR)`` is
   expanded in ``command`` and ``args``.
3. **Paths**: each volume mount path is mapped to a directory of the pod on the local disk; an
   argument or environment value naming a path under a mount path is rewritten to the local
   path (``--config=/etc/kvgate/router.yaml`` → ``.../volumes/config/router.yaml``).

Nothing here does I/O: the caller fetches ConfigMaps and Secrets and writes volumes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["vllm", "kvgate", "redis", "none"]

# (kind, name) -> key -> value; kind is "configmap" or "secret".
RefValues = Mapping[tuple[str, str], Mapping[str, str]]

_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_FIELD_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")


@dataclass(frozen=True)
class ProcessSpec:
    """What to run for one container."""

    container: str
    kind: Kind
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)


def image_kind(image: str) -> Kind:
    """Classify a container image by its repository name (registry and tag ignored)."""
    parts = image.split("@", 1)[0].lower().split("/")
    parts[-1] = parts[-1].split(":", 1)[0]  # the tag
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # the registry host
    name = "/".join(parts)
    if "vllm" in name:
        return "vllm"
    if "kvgate" in name:
        return "kvgate"
    if "redis" in name or "valkey" in name:
        return "redis"
    return "none"


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: unknown references stay as written, ``$$`` is ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(replace, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath`` for this pod ('' when unknown)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    subscript = _FIELD_SUBSCRIPT.match(path)
    if subscript:
        return str((meta.get(subscript.group(1)) or {}).get(subscript.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs") or []),
    }
    value = simple.get(path)
    return "" if value is None else str(value)


def env_refs(container: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The (kind, name) ConfigMaps and Secrets a container's environment reads."""
    refs: set[tuple[str, str]] = set()
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            refs.add(("configmap", source["configMapKeyRef"]["name"]))
        if "secretKeyRef" in source:
            refs.add(("secret", source["secretKeyRef"]["name"]))
    for item in container.get("envFrom") or []:
        if "configMapRef" in item:
            refs.add(("configmap", item["configMapRef"]["name"]))
        if "secretRef" in item:
            refs.add(("secret", item["secretRef"]["name"]))
    return refs


class MissingReference(ValueError):
    """A non-optional ConfigMap/Secret key the container needs does not exist."""


def resolve_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], refs: RefValues
) -> dict[str, str]:
    """The container's environment, in the kubelet's order (envFrom first, then env)."""
    env: dict[str, str] = {}
    for item in container.get("envFrom") or []:
        prefix = item.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in item:
                ref = item[key]
                values = refs.get((kind, ref["name"]))
                if values is None and not ref.get("optional", False):
                    raise MissingReference(f"{kind} {ref['name']} not found")
                for name, value in (values or {}).items():
                    env[prefix + name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand_vars(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = "1"
        else:
            for kind, key in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
                if key in source:
                    ref = source[key]
                    values = refs.get((kind, ref["name"])) or {}
                    if ref["key"] in values:
                        env[name] = values[ref["key"]]
                    elif not ref.get("optional", False):
                        raise MissingReference(f"{kind} {ref['name']} has no key {ref['key']}")
    return env


def rewrite_paths(text: str, mounts: Mapping[str, Path]) -> str:
    """Map absolute paths under a container mount path to their local directory.

    The longest mount path wins; a path matches at the start of the text or after ``=``.
    """
    for mount_path in sorted(mounts, key=len, reverse=True):
        pattern = re.compile(rf"(^|=){re.escape(mount_path.rstrip('/'))}(?=/|$)")
        match = pattern.search(text)
        if match:
            local = str(mounts[mount_path])
            return text[: match.start()] + match.group(1) + local + text[match.end() :]
    return text


def _strip_vllm_entrypoint(words: list[str]) -> list[str]:
    """Drop ``vllm serve`` / ``python -m vllm.entrypoints...`` so only the flags remain."""
    if words[:2] == ["vllm", "serve"] or (
        len(words) >= 2 and Path(words[0]).name == "vllm" and words[1] == "serve"
    ):
        return words[2:]
    if "-m" in words:
        index = words.index("-m")
        if index + 1 < len(words) and words[index + 1] in _VLLM_MODULES:
            rest = words[index + 2 :]
            return rest[1:] if rest[:1] == ["serve"] else rest
    return words


def _strip_kvgate_entrypoint(words: list[str]) -> list[str]:
    if words and Path(words[0]).name == "kvgate":
        return words[1:]
    if "-m" in words:
        index = words.index("-m")
        if index + 1 < len(words) and words[index + 1] in ("kvgate", "kvgate.cli"):
            return words[index + 2 :]
    return words


def program_argv(kind: Kind, words: Sequence[str], kvgate: str) -> list[str]:
    """The local argv for a container's command+args (already expanded and rewritten)."""
    if kind == "vllm":
        return [kvgate, "sim", "serve", *_strip_vllm_entrypoint(list(words))]
    if kind == "kvgate":
        return [kvgate, *_strip_kvgate_entrypoint(list(words))]
    if kind == "redis":
        rest = list(words)
        if rest and Path(rest[0]).name in ("redis-server", "valkey-server"):
            rest = rest[1:]
        # Later options win in redis-server: no snapshots on the local disk; the pod's network
        # namespace is private, so protected mode (loopback-only without a password) is off,
        # as in the official image's config.
        return ["redis-server", *rest, "--protected-mode", "no", "--save", ""]
    return []


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    """Named container ports (for probes that name their port)."""
    return {
        str(port["name"]): int(port["containerPort"])
        for port in container.get("ports") or []
        if port.get("name")
    }


def process_spec(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    refs: RefValues,
    mounts: Mapping[str, Path],
    kvgate: str,
    base_env: Mapping[str, str],
) -> ProcessSpec:
    """Everything needed to start one container of a running pod as a local process."""
    kind = image_kind(str(container.get("image", "")))
    pod_env = resolve_env(pod, container, refs)
    words = [
        expand_vars(str(w), pod_env)
        for w in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    words = [rewrite_paths(w, mounts) for w in words]
    env = dict(base_env)
    for name, value in pod_env.items():
        env[name] = rewrite_paths(value, mounts)
    working_dir = container.get("workingDir")
    cwd = Path(rewrite_paths(working_dir, mounts)) if working_dir else None
    if cwd is not None and not any(str(cwd).startswith(str(p)) for p in mounts.values()):
        cwd = None  # a directory of the image: it does not exist here
    return ProcessSpec(
        container=str(container["name"]),
        kind=kind,
        argv=program_argv(kind, words, kvgate),
        env=env,
        cwd=cwd,
        ports=container_ports(container),
    )
