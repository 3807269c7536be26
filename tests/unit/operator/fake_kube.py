"""Test doubles: an in-memory Kubernetes API for the reconciler's unit tests (no kopf, no network)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from kvgate.operator.kube import KubeError, resource_path
from kvgate.operator.render.common import FIELD_MANAGER

Json = dict[str, Any]


class FakeKube:
    """Stores objects by (apiVersion, kind, namespace, name); `apply` replaces the object's
    spec-like fields as server-side apply with force does for the fields the operator owns."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], Json] = {}
        self.applied: list[Json] = []
        self.status_patches: list[tuple[str, str, Json]] = []
        self.fail_apply: dict[str, KubeError] = {}  # kind -> error to raise
        self.fail_all: KubeError | None = None
        self._uids = itertools.count(1)

    @staticmethod
    def key(obj: Json) -> tuple[str, str, str, str]:
        meta = obj["metadata"]
        return (obj["apiVersion"], obj["kind"], meta.get("namespace", "default"), meta["name"])

    def put(self, obj: Json) -> Json:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("generation", 1)
        self.objects[self.key(obj)] = obj
        return obj

    def find(self, kind: str, name: str, namespace: str = "default") -> Json | None:
        for (_, k, ns, n), obj in self.objects.items():
            if (k, ns, n) == (kind, namespace, name):
                return obj
        return None

    def kinds(self) -> list[str]:
        return sorted(k for (_, k, _, _) in self.objects)

    async def apply(self, obj: Json) -> Json:
        if self.fail_all:
            raise self.fail_all
        resource_path(obj["apiVersion"], obj["kind"], "ns")  # unknown kinds fail like the real one
        if obj["kind"] in self.fail_apply:
            raise self.fail_apply[obj["kind"]]
        self.applied.append(copy.deepcopy(obj))
        current = self.objects.get(self.key(obj))
        merged = copy.deepcopy(obj)
        merged["metadata"]["managedFields"] = [{"manager": FIELD_MANAGER, "operation": "Apply"}]
        if current is not None:
            generation = int(current["metadata"].get("generation", 1))
            merged["metadata"]["uid"] = current["metadata"]["uid"]
            merged["metadata"]["generation"] = generation
            same = {k: v for k, v in current.items() if k != "status"} == merged
            if "status" in current:
                merged["status"] = current["status"]
            if not same:
                merged["metadata"]["generation"] = generation + 1
        return copy.deepcopy(self.put(merged))

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Json | None:
        if self.fail_all:
            raise self.fail_all
        found = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(found) if found else None

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
    ) -> list[Json]:
        if self.fail_all:
            raise self.fail_all
        return [
            copy.deepcopy(o)
            for (v, k, ns, _), o in sorted(self.objects.items())
            if (v, k) == (api_version, kind) and namespace in (None, ns)
        ]

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: Json
    ) -> None:
        if self.fail_all:
            raise self.fail_all
        self.status_patches.append((kind, name, copy.deepcopy(status)))
        found = self.objects.get((api_version, kind, namespace, name))
        if found is not None:
            found["status"] = {**found.get("status", {}), **copy.deepcopy(status)}


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str, str]] = []  # (object name, type, reason, message)

    async def __call__(self, body: Json, *, type: str, reason: str, message: str) -> None:
        self.posted.append((body["metadata"]["name"], type, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.posted]
