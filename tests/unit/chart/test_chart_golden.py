"""Golden `helm template` output of charts/kvgate for representative values.

Regenerate after an intended change with `KVGATE_UPDATE_GOLDEN=1 pytest tests/unit/chart`, and
review the diff of tests/data/chart/. The generated Redis password (random on each render) is
replaced by a placeholder; everything else must match byte for byte.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import ROOT, SERVICE_MONITOR_API, template_text

GOLDEN_DIR = ROOT / "tests" / "data" / "chart"
GENERATED = "<generated>"

CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # helm install kvgate charts/kvgate
    "default": ({}, ()),
    # Your own Redis, CRDs managed elsewhere, no dashboards.
    "external-redis": (
        {
            "crds": {"enabled": False},
            "dashboards": {"enabled": False},
            "redis": {
                "enabled": False,
                "external": {
                    "url": "rediss://redis.example.internal:6380/2",
                    "existingSecret": "my-redis",
                    "secretKey": "password",
                },
            },
            "indexer": {"enabled": True, "pools": [{"name": "llama", "model": "llama-3.1-8b"}]},
        },
        (),
    ),
    # Everything on: indexer over two namespaces, ServiceMonitors, scheduling, pinned digest.
    "full": (
        {
            "fullnameOverride": "kv",
            "commonLabels": {"team": "inference"},
            "imagePullSecrets": ["regcred", {"name": "mirror"}],
            "image": {"digest": "sha256:" + "ab" * 32},
            "crds": {"keep": False},
            "operator": {
                "watchNamespaces": ["llm", "batch"],
                "routerImage": "registry.example/kvgate:0.1.0-router",
                "logLevel": "DEBUG",
                "priorityClassName": "system-cluster-critical",
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
                "serviceAccount": {"annotations": {"iam.example/role": "kvgate"}},
            },
            "redis": {
                "auth": {"password": "s3cret"},
                "persistence": {"enabled": True, "storageClass": "fast", "size": "2Gi"},
                "nodeSelector": {"kubernetes.io/os": "linux"},
            },
            "indexer": {
                "enabled": True,
                "replicas": 2,
                "pools": [
                    {"name": "llama-online", "namespace": "llm", "model": "llama-3.1-8b",
                     "engine": {"block_size": 16, "hash_algo": "sha256_cbor", "hash_seed": "42"}},
                    {"name": "llama-batch", "namespace": "batch", "model": "llama-3.1-8b"},
                ],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                     "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "indexer"}}}}
                ]}},
            },
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "dashboards": {
                "label": "grafana_dashboard",
                "labelValue": "kvgate",
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "kvgate"},
            },
        },
        (SERVICE_MONITOR_API,),
    ),
}  # fmt: skip


def _cut(raw: str, key: str, marker: str) -> str:
    """Replace the block under the top-level `key:` of one document with a marker line."""
    lines = raw.split("\n")
    start = lines.index(f"{key}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")),
        len(lines),
    )
    return "\n".join([*lines[:start], f"{key}: {marker}", *lines[end:]])


def normalise(text: str) -> str:
    """Make the golden files about the chart alone.

    The generated Redis password (random on each render) becomes a placeholder. The CRDs' specs
    and the operator's RBAC rules come from crds/ and deploy/rbac/ (other owners regenerate
    them): test_chart_render checks they are copied exactly, so here they become markers.
    """
    out = []
    for raw in text.split("\n---\n"):
        doc = yaml.safe_load(raw)
        if doc and doc.get("kind") == "Secret" and doc["metadata"]["name"].endswith("-redis"):
            for value in doc["data"].values():
                if len(base64.b64decode(value)) == 32:  # randAlphaNum 32
                    raw = raw.replace(value, GENERATED)
        if doc and doc.get("kind") == "CustomResourceDefinition":
            raw = _cut(raw, "spec", "'<crds/: checked by test_crds_are_the_generated_ones>'")
        if doc and doc.get("kind") == "ClusterRole" and "rules" in doc:
            raw = _cut(raw, "rules", "'<deploy/rbac/operator.yaml: checked by test_operator_rbac>'")
        out.append(raw)
    return "\n---\n".join(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    values, api_versions = CASES[case]
    rendered = normalise(template_text(values, api_versions).stdout)
    golden: Path = GOLDEN_DIR / f"{case}.golden.yaml"
    if os.environ.get("KVGATE_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
    assert golden.exists(), f"missing {golden}: run with KVGATE_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(encoding="utf-8"), (
        f"helm template differs from {golden.name}; if intended, regenerate with "
        "KVGATE_UPDATE_GOLDEN=1 and review the diff"
    )
