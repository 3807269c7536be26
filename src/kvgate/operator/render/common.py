"""Names, labels and owner references shared by every object the operator renders.

Every object carries the recommended labels of DESIGN.md §4 (`app.kubernetes.io/name: kvgate`,
`component`, `instance` = the owning resource's name, `managed-by: kvgate`) plus `kvgate.io/pool`
or `kvgate.io/policy`; the owning custom resource is the object's controller owner, so deleting
it garbage-collects everything it owns.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from kvgate.api.base import GROUP_VERSION, JsonDict, PodTemplateOverrides

NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
POOL_LABEL = "kvgate.io/pool"
POLICY_LABEL = "kvgate.io/policy"
POOL_CLASS_LABEL = "kvgate.io/pool-class"
MANAGED_BY = "kvgate"
FIELD_MANAGER = "kvgate-operator"


@dataclass(frozen=True, slots=True)
class Owner:
    """The custom resource that owns the rendered objects."""

    kind: str
    name: str
    namespace: str
    uid: str
    generation: int = 0

    @classmethod
    def from_body(cls, body: JsonDict) -> Owner:
        meta = body["metadata"]
        return cls(
            kind=str(body["kind"]),
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
        )

    def reference(self) -> JsonDict:
        return {
            "apiVersion": GROUP_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def recommended_labels(component: str, instance: str) -> dict[str, str]:
    return {
        NAME_LABEL: "kvgate",
        COMPONENT_LABEL: component,
        INSTANCE_LABEL: instance,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def metadata(
    name: str,
    owner: Owner,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> JsonDict:
    meta: JsonDict = {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def selector_string(match_labels: dict[str, str]) -> str:
    """`k=v,k=v` in sorted order: the form of a label selector in status and the router config."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def content_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able value."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dns_label(*parts: str, max_length: int = 63) -> str:
    """A DNS-1123 label built from `parts`; shortened with a hash suffix when too long."""
    raw = "-".join(p for p in parts if p)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-") or "x"
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{name[: max_length - 9].rstrip('-')}-{digest}"


def probe(path: str, port: str, period: int, failures: int, timeout: int = 2) -> JsonDict:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def field_env(name: str, field_path: str) -> JsonDict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def pod_scheduling(pod: PodTemplateOverrides) -> JsonDict:
    """The pod-spec scheduling fields that `pod` sets: nodeSelector, tolerations, priorityClassName."""
    spec: JsonDict = {}
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spec["tolerations"] = [t.to_wire() for t in pod.tolerations]
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    return spec


def service_port(name: str, port: int) -> JsonDict:
    """A TCP Service port that targets the container port of the same name."""
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
