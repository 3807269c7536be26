"""Golden files: custom resources in (examples/ and tests/data/operator/*.input.yaml), every
rendered Kubernetes object out (tests/data/operator/*.golden.yaml).

A change in what the operator renders shows up as a diff of the golden file in review.
Regenerate after an intended change with `KVGATE_UPDATE_GOLDEN=1 pytest tests/unit/operator`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec
from kvgate.api.router_config import parse_router_config
from kvgate.operator.reconcile import selects
from kvgate.operator.render import Owner, SelectedPool, policy_children, pool_children
from kvgate.operator.render.router import needs_indexer

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "operator"
EXAMPLES = ROOT / "examples"
ROUTER_IMAGE = "kvgate:test"

CASES: dict[str, list[Path]] = {
    "examples": sorted(EXAMPLES.glob("*.yaml")),
    "pool-full": [DATA / "pool-full.input.yaml"],
    "tokenizer-configmap": [DATA / "tokenizer-configmap.input.yaml"],
}


def _owner(doc: dict[str, Any]) -> Owner:
    doc = {**doc, "metadata": {"uid": f"uid-of-{doc['metadata']['name']}", **doc["metadata"]}}
    return Owner.from_body(doc)


def render_documents(paths: list[Path]) -> list[dict[str, Any]]:
    docs = [d for p in paths for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d]
    pools = [d for d in docs if d["kind"] == "InferencePool"]
    out: list[dict[str, Any]] = []
    for pool in pools:
        out += pool_children(_owner(pool), InferencePoolSpec.model_validate(pool["spec"]))
    for policy in (d for d in docs if d["kind"] == "RoutingPolicy"):
        spec = RoutingPolicySpec.model_validate(policy["spec"])
        owner = _owner(policy)
        selected = [
            SelectedPool(
                p["metadata"]["name"],
                owner.namespace,
                InferencePoolSpec.model_validate(p["spec"]),
            )
            for p in pools
            if selects(spec, p)
        ]
        indexer = 1 if needs_indexer(spec) else None
        children, _hash = policy_children(owner, spec, selected, ROUTER_IMAGE, indexer)
        out += children
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_objects_match_golden_file(case: str) -> None:
    rendered = yaml.safe_dump_all(render_documents(CASES[case]), sort_keys=False, width=100)
    golden = DATA / f"{case}.golden.yaml"
    if os.environ.get("KVGATE_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered, encoding="utf-8")
    assert golden.exists(), f"missing {golden}: run with KVGATE_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_router_config_loads_in_the_router(case: str) -> None:
    maps = [o for o in render_documents(CASES[case]) if o["kind"] == "ConfigMap"]
    assert maps, "every case has a policy"
    for config_map in maps:
        config = parse_router_config(config_map["data"]["router.yaml"])
        assert config.pools


def test_every_example_is_a_valid_resource() -> None:
    kinds = []
    for path in CASES["examples"]:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            kinds.append(doc["kind"])
            if doc["kind"] == "InferencePool":
                InferencePoolSpec.model_validate(doc["spec"])
            elif doc["kind"] == "RoutingPolicy":
                RoutingPolicySpec.model_validate(doc["spec"])
    assert sorted(set(kinds)) == ["InferencePool", "RoutingPolicy", "Secret"]
