"""deploy/rbac: the operator may do exactly what it does, and the router Role matches the rendered one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from test_render_golden import CASES, render_documents

from kvgate.operator.kube import PLURALS

ROOT = Path(__file__).resolve().parents[3]


def _docs(name: str) -> list[dict[str, Any]]:
    text = (ROOT / "deploy" / "rbac" / name).read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if d]


def _operator_rules() -> list[dict[str, Any]]:
    role = next(d for d in _docs("operator.yaml") if d["kind"] == "ClusterRole")
    return list(role["rules"])


def allowed(api_version: str, resource: str, verb: str) -> bool:
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
        for r in _operator_rules()
    )


def test_no_wildcards_and_no_deletes() -> None:
    for rule in _operator_rules():
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key]
        assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]


def test_operator_may_apply_every_kind_it_renders() -> None:
    rendered = {
        (o["apiVersion"], o["kind"]) for case in CASES.values() for o in render_documents(case)
    }
    assert len(rendered) == 7
    for api_version, kind in rendered:
        plural = PLURALS[(api_version, kind)]
        for verb in ("get", "create", "patch"):
            assert allowed(api_version, plural, verb), (kind, verb)


def test_operator_may_watch_what_it_watches() -> None:
    for api_version, plural in [
        ("kvgate.io/v1alpha1", "inferencepools"),
        ("kvgate.io/v1alpha1", "routingpolicies"),
        ("apps/v1", "deployments"),
        ("v1", "services"),
        ("v1", "configmaps"),
        ("policy/v1", "poddisruptionbudgets"),
    ]:
        for verb in ("list", "watch"):
            assert allowed(api_version, plural, verb), (plural, verb)
    assert allowed("kvgate.io/v1alpha1", "inferencepools/status", "patch")
    assert allowed("v1", "secrets", "get") and not allowed("v1", "secrets", "list")


def test_operator_holds_what_the_router_role_grants() -> None:
    role = next(d for d in _docs("router.yaml") if d["kind"] == "Role")
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allowed(f"{group}/v1" if group else "v1", resource, verb)


def test_reference_router_role_matches_the_rendered_one() -> None:
    reference = next(d for d in _docs("router.yaml") if d["kind"] == "Role")
    rendered = [o for o in render_documents(CASES["examples"]) if o["kind"] == "Role"]
    assert rendered and all(r["rules"] == reference["rules"] for r in rendered)
