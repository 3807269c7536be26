"""kvgate's CRDs on a real API server: they install, and bad specs are rejected at apply time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import Cluster

pytestmark = pytest.mark.e2e

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def rule_messages(crd_file: str) -> list[str]:
    """Every x-kubernetes-validations message of a CRD file."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.extend(r["message"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load((CRD_DIR / crd_file).read_text()))
    return found


def message(crd_file: str, start: str) -> str:
    matches = [m for m in rule_messages(crd_file) if m.startswith(start)]
    assert len(matches) == 1, f"no single rule message starting with {start!r} in {crd_file}"
    return matches[0]


def pool(spec: dict[str, Any], name: str = "p") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def policy(spec: dict[str, Any], name: str = "r") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "RoutingPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def test_crds_are_established_and_served(cluster: Cluster, crds: list[str]) -> None:
    assert set(crds) == {"inferencepools.kvgate.io", "routingpolicies.kvgate.io"}
    resources = cluster.kubectl("api-resources", "--api-group", "kvgate.io", "-o", "name").stdout
    assert set(resources.split()) == set(crds)


def test_a_minimal_pool_is_accepted_and_defaulted(
    cluster: Cluster, crds: list[str], namespace: str
) -> None:
    cluster.apply(pool({"model": "Qwen/Qwen3-0.6B"}), namespace)
    stored = cluster.get("inferencepools.kvgate.io", "p", "-n", namespace)
    assert stored["spec"]["engine"]["blockSize"] == 16
    assert stored["spec"]["cache"]["hashAlgo"] == "sha256"


POOLS = "kvgate.io_inferencepools.yaml"
POLICIES = "kvgate.io_routingpolicies.yaml"


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            pool({"model": "m", "engine": {"blockSize": 24}}),
            (POOLS, "blockSize must be a power of two"),
        ),
        (
            pool({"model": "m", "engine": {"blockSize": 32, "maxModelLen": 16}}),
            (POOLS, "maxModelLen must be at least blockSize"),
        ),
        (
            pool({"model": "m", "engine": {"extraArgs": ["--enforce-eager", "--port=9000"]}}),
            (POOLS, "extraArgs may not set flags kvgate manages"),
        ),
        (
            pool({"model": "m", "tokenizer": {"path": "/t", "configMap": "tok"}}),
            (POOLS, "give at most one of tokenizer.path"),
        ),
        (policy({"pools": []}), (POLICIES, "a RoutingPolicy must name at least one pool")),
        (
            policy({"pools": ["p"], "tenants": {"items": [{"name": "a"}, {"name": "a"}]}}),
            (POLICIES, "tenant names must be unique"),
        ),
        (
            policy({"pools": ["p"], "flowControl": {"maxDeadlineSeconds": 20}}),
            (POLICIES, "onlineMaxWaitSeconds and batchMaxWaitSeconds must not exceed"),
        ),
        (
            policy(
                {
                    "pools": ["p"],
                    "directory": {
                        "redis": {"caBundle": {"secret": "s", "configMap": "c", "key": "ca.crt"}}
                    },
                }
            ),
            (POLICIES, "give exactly one of secret and configMap"),
        ),
    ],
    ids=[
        "block-size",
        "max-model-len",
        "managed-flag",
        "tokenizer",
        "no-pool",
        "tenants",
        "flow-deadlines",
        "ca",
    ],
)
def test_invalid_specs_are_rejected_with_their_rule_message(
    cluster: Cluster, crds: list[str], namespace: str, manifest: str, expected: tuple[str, str]
) -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, f"accepted an invalid spec:\n{manifest}"
    expected_message = message(*expected)
    assert expected_message in " ".join(result.stderr.split()), result.stderr


def test_schema_bounds_and_required_fields_are_enforced(
    cluster: Cluster, crds: list[str], namespace: str
) -> None:
    negative = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=pool({"model": "m", "replicas": -1}), check=False
    )
    assert negative.returncode != 0 and "spec.replicas" in negative.stderr
    # the API server would refuse the PodDisruptionBudget, and with it every later apply
    for bad in (-1, "150%"):
        spec = pool({"model": "m", "maxUnavailable": bad})
        refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=spec, check=False)
        assert refused.returncode != 0 and "spec.maxUnavailable" in refused.stderr
    # another namespace's Secret, by a path in its name
    stolen = {
        "url": "redis://r:6379",
        "password": {"name": "../../kube-system/secrets/x", "key": "k"},
    }
    sneaky = policy({"pools": ["p"], "directory": {"redis": stolen}})
    refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sneaky, check=False)
    assert refused.returncode != 0 and "spec.directory.redis.password.name" in refused.stderr
    missing = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pool({}), check=False)
    assert missing.returncode != 0 and "spec.model: Required value" in missing.stderr
    not_redis = policy({"pools": ["p"], "directory": {"redis": {"url": "http://r:6379/0"}}})
    wrong = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=not_redis, check=False)
    assert wrong.returncode != 0 and "spec.directory.redis.url" in wrong.stderr
    managed = {
        "urlSecret": {"name": "managed", "key": "url"},
        "cluster": True,
        "caBundle": {"configMap": "redis-ca", "key": "ca.crt"},
    }
    cluster.apply(policy({"pools": ["p"], "directory": {"redis": managed}}, "managed"), namespace)
    stored = cluster.get("routingpolicy", "managed", "-n", namespace)
    assert stored["spec"]["directory"]["redis"]["caBundle"] == managed["caBundle"]
