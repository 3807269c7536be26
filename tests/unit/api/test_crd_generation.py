"""The generated CRDs: in sync with crds/ and docs/crds.md, structural, with the expected shape."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from kvgate.api import crds_command
from kvgate.api.crd_docs import crd_files, crds_markdown
from kvgate.api.crdgen import SchemaError, all_crds, openapi_schema, structural_problems

ROOT = Path(__file__).resolve().parents[3]


def _root(name: str) -> dict:  # type: ignore[type-arg]
    crd = all_crds()[name]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


POOL = "kvgate.io_inferencepools.yaml"
POLICY = "kvgate.io_routingpolicies.yaml"


@pytest.mark.parametrize("name", [POOL, POLICY])
def test_committed_crds_match_generator(name: str) -> None:
    committed = (ROOT / "crds" / name).read_text(encoding="utf-8")
    assert committed == crd_files()[name], "crds/ is stale: run `make crds`"


def test_committed_docs_match_generator() -> None:
    committed = (ROOT / "docs" / "crds.md").read_text(encoding="utf-8")
    assert committed == crds_markdown(), "docs/crds.md is stale: run `make crds`"


@pytest.mark.parametrize("name", [POOL, POLICY])
def test_schemas_are_structural(name: str) -> None:
    assert structural_problems(_root(name)) == []


def test_structural_checker_catches_problems() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "b": {"type": "array"},
            "c": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "d": {"type": "object", "required": ["x"], "default": {}},
            "e": {"type": "null"},
        },
    }
    problems = "\n".join(structural_problems(bad))
    for needle in (
        ".a: 'anyOf'",
        ".a: no type",
        ".b: array without items",
        ".c: properties and additionalProperties",
        ".d: default on an object with required",
        ".e: unknown type",
    ):
        assert needle in problems


def test_real_unions_are_refused() -> None:
    from pydantic import BaseModel

    class Bad(BaseModel):
        x: int | list[int]

    with pytest.raises(SchemaError, match="unions"):
        openapi_schema(Bad)


def test_crds_parse_back_as_yaml_without_aliases() -> None:
    for text in crd_files().values():
        assert "&id" not in text and "*id" not in text
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


def test_pool_crd_shape() -> None:
    crd = all_crds()[POOL]
    assert crd["metadata"]["name"] == "inferencepools.kvgate.io"
    names = crd["spec"]["names"]
    # The Gateway API Inference Extension owns `inferencepool`/`pool`: our short names differ.
    assert names["shortNames"] == ["kvpool", "kvpools"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Age"] == ".metadata.creationTimestamp"
    spec = _root(POOL)["properties"]["spec"]
    assert spec["required"] == ["model"]
    assert spec["properties"]["replicas"]["minimum"] == 0
    assert spec["properties"]["poolClass"]["enum"] == ["online", "batch"]
    assert spec["properties"]["maxUnavailable"]["x-kubernetes-int-or-string"] is True
    gmu = spec["properties"]["engine"]["properties"]["gpuMemoryUtilization"]
    assert gmu == {
        "default": 0.9,
        "description": gmu["description"],
        "minimum": 0.0,
        "exclusiveMinimum": True,
        "maximum": 1.0,
        "type": "number",
    }
    status = _root(POOL)["properties"]["status"]
    assert "default" not in yaml.safe_dump(status), "status schemas carry no defaults"


def test_policy_crd_shape() -> None:
    crd = all_crds()[POLICY]
    assert crd["spec"]["names"]["shortNames"] == ["kvpolicy", "kvpolicies"]
    assert "scale" not in crd["spec"]["versions"][0]["subresources"]
    spec = _root(POLICY)["properties"]["spec"]
    params = spec["properties"]["scoring"]["properties"]["params"]
    assert params == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": params["description"],
    }
    borrowing = spec["properties"]["borrowing"]["properties"]["maxKvCacheUsage"]
    assert (borrowing["minimum"], borrowing["maximum"]) == (0.0, 1.0)


def test_crds_command_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    crds_command.add_arguments(parser)
    out, docs = tmp_path / "crds", tmp_path / "docs" / "crds.md"
    args = parser.parse_args(["--out", str(out), "--docs", str(docs), "--check"])
    assert crds_command.run(args) == 1
    assert "out of date" in capsys.readouterr().out
    args = parser.parse_args(["--out", str(out), "--docs", str(docs)])
    assert crds_command.run(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(crd_files())
    args = parser.parse_args(["--out", str(out), "--docs", str(docs), "--check"])
    assert crds_command.run(args) == 0
    (out / POOL).write_text("edited", encoding="utf-8")
    assert crds_command.run(args) == 1


def test_crds_command_stdout_is_one_applyable_stream(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    crds_command.add_arguments(parser)
    assert crds_command.run(parser.parse_args(["--stdout"])) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in docs] == [
        "inferencepools.kvgate.io",
        "routingpolicies.kvgate.io",
    ]
