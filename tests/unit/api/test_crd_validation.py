"""What the API server does with a spec: apply schema defaults, then run the CEL rules.

The CEL rules are compiled and evaluated with cel-python (standard CEL, which is what the rules
use), on the same defaulted object the API server would see; the pydantic models must agree with
the schema on what is valid.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
from pydantic import ValidationError

from kvgate.api.crdgen import all_crds
from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec

Json = Any


def _spec_schema(name: str) -> Json:
    crd = all_crds()[name]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def apply_defaults(schema: Json, obj: Json) -> Json:
    """Structural defaulting, as the API server does it (defaults of absent properties)."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


def cel_failures(schema: Json, obj: Json) -> list[str]:
    """Messages of the rules that ``obj`` violates."""
    env = celpy.Environment()
    failures: list[str] = []

    def walk(node: Json, value: Json) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            program = env.program(env.compile(rule["rule"]))
            if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
                failures.append(rule["message"])
        if isinstance(value, dict):
            for name, sub in node.get("properties", {}).items():
                if name in value:
                    walk(sub, value[name])
        elif isinstance(value, list) and "items" in node:
            for item in value:
                walk(node["items"], item)

    walk(schema, obj)
    return failures


def _check(name: str, spec: Json) -> list[str]:
    schema = _spec_schema(name)
    return cel_failures(schema, apply_defaults(schema, copy.deepcopy(spec)))


POOL = "kvgate.io_inferencepools.yaml"
POLICY = "kvgate.io_routingpolicies.yaml"


def test_every_rule_compiles() -> None:
    env = celpy.Environment()
    count = 0
    for crd in all_crds().values():
        text = str(crd)
        for rule in _rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]):
            env.compile(rule)
            count += 1
        assert "x-kubernetes-validations" in text
    assert count >= 5


def _rules(node: Json) -> list[str]:
    found = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
    for sub in node.get("properties", {}).values():
        found += _rules(sub)
    if isinstance(node.get("items"), dict):
        found += _rules(node["items"])
    return found


def test_a_minimal_pool_passes_and_defaults_fill_in() -> None:
    spec = {"model": "Qwen/Qwen3-0.6B"}
    schema = _spec_schema(POOL)
    defaulted = apply_defaults(schema, copy.deepcopy(spec))
    assert defaulted["engine"]["blockSize"] == 16
    assert defaulted["cache"] == {"hashAlgo": "sha256", "hashSeed": 0, "cacheOps": False}
    assert defaulted["command"] == ["vllm", "serve"]
    assert cel_failures(schema, defaulted) == []
    # The pydantic model fills in exactly the same defaults.
    assert InferencePoolSpec.model_validate(spec).to_wire()["engine"]["blockSize"] == 16


@pytest.mark.parametrize("block_size", [3, 12, 48, 100])
def test_block_size_not_a_power_of_two_is_rejected(block_size: int) -> None:
    failures = _check(POOL, {"model": "m", "engine": {"blockSize": block_size}})
    assert any("power of two" in f for f in failures)


@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 256])
def test_powers_of_two_pass(block_size: int) -> None:
    assert _check(POOL, {"model": "m", "engine": {"blockSize": block_size}}) == []


def test_max_model_len_below_block_size_is_rejected() -> None:
    failures = _check(POOL, {"model": "m", "engine": {"blockSize": 32, "maxModelLen": 16}})
    assert failures == ["maxModelLen must be at least blockSize"]
    assert _check(POOL, {"model": "m", "engine": {"maxModelLen": 4096}}) == []


@pytest.mark.parametrize(
    "arg", ["--port", "--port=9000", "--kv-events-config={}", "--block-size", "--max-loras=4"]
)
def test_extra_args_cannot_override_managed_flags(arg: str) -> None:
    failures = _check(POOL, {"model": "m", "engine": {"extraArgs": ["--seed", "1", arg]}})
    assert len(failures) == 1 and "use the matching spec.engine or spec.lora field" in failures[0]


def test_lora_adapters_are_unique_and_need_no_equals_sign() -> None:
    adapters = [{"name": "sql", "path": "/a/sql"}, {"name": "sql", "path": "/a/sql2"}]
    assert _check(POOL, {"model": "m", "lora": {"adapters": adapters}}) == [
        "LoRA adapter names must be unique"
    ]
    with pytest.raises(ValidationError):
        InferencePoolSpec.model_validate(
            {"model": "m", "lora": {"adapters": [{"name": "a=b", "path": "/p"}]}}
        )
    with pytest.raises(ValidationError):
        InferencePoolSpec.model_validate({"model": "m", "lora": {"adapters": []}})


def test_other_extra_args_pass() -> None:
    spec = {"model": "m", "engine": {"extraArgs": ["--enforce-eager", "--portable=1"]}}
    assert _check(POOL, spec) == []


def test_tokenizer_path_and_configmap_are_exclusive() -> None:
    spec = {"model": "m", "tokenizer": {"path": "/t", "configMap": "tok"}}
    assert _check(POOL, spec) == ["give at most one of tokenizer.path and tokenizer.configMap"]
    with pytest.raises(ValidationError):
        InferencePoolSpec.model_validate({"model": "m", "replicas": -1})


def test_a_policy_must_name_a_pool() -> None:
    message = (
        "a RoutingPolicy must name at least one pool: set spec.pools, spec.poolRefs or "
        "spec.poolSelector.matchLabels"
    )
    assert _check(POLICY, {}) == [message]
    assert _check(POLICY, {"pools": []}) == [message]
    assert _check(POLICY, {"poolSelector": {}}) == [message]
    assert _check(POLICY, {"poolSelector": {"matchLabels": {}}}) == [message]
    assert _check(POLICY, {"pools": ["llama"]}) == []
    assert _check(POLICY, {"poolSelector": {"matchLabels": {"team": "a"}}}) == []
    assert _check(POLICY, {"poolRefs": []}) == [message]
    assert _check(POLICY, {"poolRefs": [{"name": "gie", "model": "m"}]}) == []


def test_gateway_pool_refs_name_each_pool_once_with_a_valid_block_size() -> None:
    refs = [{"name": "gie", "model": "m"}, {"name": "gie", "model": "n"}]
    assert _check(POLICY, {"poolRefs": refs}) == ["poolRefs must name each InferencePool once"]
    refs = [{"name": "gie", "model": "m", "blockSize": 12}]
    assert _check(POLICY, {"poolRefs": refs}) == ["blockSize must be a power of two, 1 to 256"]
    with pytest.raises(ValidationError):
        RoutingPolicySpec.model_validate(
            {"poolRefs": [{"name": "gie", "model": "m", "group": "kvgate.io"}]}
        )


def test_tenant_names_must_be_unique() -> None:
    tenants = {"items": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}
    assert _check(POLICY, {"pools": ["p"], "tenants": tenants}) == ["tenant names must be unique"]
    tenants = {"items": [{"name": "a"}, {"name": "b"}]}
    assert _check(POLICY, {"pools": ["p"], "tenants": tenants}) == []


def test_policy_defaults_mirror_the_router_config() -> None:
    from kvgate.api import router_config as rc

    spec = RoutingPolicySpec.model_validate({"pools": ["p"]})
    assert spec.borrowing.max_kv_cache_usage == rc.BorrowingConfig().max_kv_cache_usage
    assert spec.scoring.max_affinity_wait_seconds == rc.PolicyConfig().max_affinity_wait_seconds
    assert spec.sessions.header == rc.SessionsConfig().header
    schema = _spec_schema(POLICY)
    defaulted = apply_defaults(schema, {"pools": ["p"]})
    assert defaulted["borrowing"]["maxKvCacheUsage"] == rc.BorrowingConfig().max_kv_cache_usage


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_borrowing_limit_outside_unit_interval_is_rejected_by_the_model(value: float) -> None:
    with pytest.raises(ValidationError):
        RoutingPolicySpec.model_validate({"pools": ["p"], "borrowing": {"maxKvCacheUsage": value}})


def _root_failures(name: str, resource_name: str) -> list[str]:
    crd = all_crds()[name]
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    only_root = {"x-kubernetes-validations": root["x-kubernetes-validations"]}
    return cel_failures(only_root, {"metadata": {"name": resource_name}, "spec": {}})


@pytest.mark.parametrize("bad", ["1llama", "Llama", "llama_3", "llama-", "x" * 64])
def test_pool_names_must_make_valid_service_names(bad: str) -> None:
    failures = _root_failures(POOL, bad)
    assert len(failures) == 1 and "at most 63 characters" in failures[0]


@pytest.mark.parametrize("good", ["l", "llama-3-8b", "x" * 63])
def test_valid_pool_names_pass(good: str) -> None:
    assert _root_failures(POOL, good) == []


def test_policy_names_leave_room_for_the_router_suffix() -> None:
    assert _root_failures(POLICY, "x" * 56) == []
    assert "at most 56 characters" in _root_failures(POLICY, "x" * 57)[0]


def test_external_indexer_needs_the_redis_directory() -> None:
    spec = {"pools": ["p"], "directory": {"embeddedIndexer": False}}
    failures = _check(POLICY, spec)
    assert len(failures) == 1 and "needs backend: redis" in failures[0]
    spec = {"pools": ["p"], "directory": {"embeddedIndexer": False, "backend": "redis"}}
    assert _check(POLICY, spec) == []


def test_warm_up_cannot_send_more_prefixes_than_it_remembers() -> None:
    spec = {"pools": ["p"], "warmup": {"topPrefixes": 300}}  # rememberedPrefixes defaults to 256
    failures = _check(POLICY, spec)
    assert len(failures) == 1 and "topPrefixes cannot exceed" in failures[0]
    assert (
        _check(POLICY, {"pools": ["p"], "warmup": {"topPrefixes": 300, "rememberedPrefixes": 300}})
        == []
    )


def test_load_sharing_forced_on_needs_the_redis_directory_and_a_ttl_over_its_interval() -> None:
    # Unset (automatic: off with the memory directory) or off: valid on either backend.
    for sharing in ({}, {"enabled": False}, {"intervalSeconds": 0.05}):
        assert _check(POLICY, {"pools": ["p"], "loadSharing": sharing}) == []
    spec = {"pools": ["p"], "loadSharing": {"enabled": True}}
    failures = _check(POLICY, spec)
    assert len(failures) == 1 and "needs directory.backend: redis" in failures[0]
    spec["directory"] = {"backend": "redis"}
    assert _check(POLICY, spec) == []
    spec["loadSharing"] = {"enabled": True, "intervalSeconds": 1.0, "ttlSeconds": 0.5}
    assert any("ttlSeconds must be longer" in f for f in _check(POLICY, spec))


def test_warm_up_sharing_forced_on_needs_the_redis_directory() -> None:
    for warmup in ({}, {"shared": False}, {"shareIntervalSeconds": 2.0}):
        assert _check(POLICY, {"pools": ["p"], "warmup": warmup}) == []
    spec = {"pools": ["p"], "warmup": {"shared": True}}
    failures = _check(POLICY, spec)
    assert (
        len(failures) == 1 and "warmup.shared: true needs directory.backend: redis" in failures[0]
    )
    spec["directory"] = {"backend": "redis"}
    assert _check(POLICY, spec) == []


def _defaults_with_rules(node: Json, path: str = "") -> list[tuple[str, Json, Json]]:
    found = []
    if "default" in node and "x-kubernetes-validations" in node:
        found.append((path, node, node["default"]))
    for name, sub in node.get("properties", {}).items():
        found += _defaults_with_rules(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _defaults_with_rules(node["items"], f"{path}[]")
    return found


@pytest.mark.parametrize("name", [POOL, POLICY])
def test_defaults_pass_their_own_rules_as_written(name: str) -> None:
    """The API server checks each `default` against the rules *without* nested defaults."""
    schema = _spec_schema(name)
    checked = _defaults_with_rules(schema)
    assert checked
    for path, node, default in checked:
        assert cel_failures(node, copy.deepcopy(default)) == [], path


@pytest.mark.parametrize(
    "spec",
    [
        {"maxUnavailable": "lots"},
        {"maxUnavailable": "25"},
        {"maxUnavailable": "150%"},  # the API server refuses such a PDB, and every later apply
        {"maxUnavailable": -1},
        {"resources": {"requests": {"cpu": "lots"}}},
        {"resources": {"limits": {"memory": "16 GB"}}},
    ],
)
def test_malformed_quantities_are_rejected(spec: Json) -> None:
    with pytest.raises(ValidationError):
        InferencePoolSpec.model_validate({"model": "m", **spec})
    schema = _spec_schema(POOL)
    assert "pattern" in schema["properties"]["maxUnavailable"]
    assert schema["properties"]["maxUnavailable"]["minimum"] == 0
    assert (
        "pattern"
        in schema["properties"]["resources"]["properties"]["requests"]["additionalProperties"]
    )


@pytest.mark.parametrize(
    "spec",
    [
        {"maxUnavailable": "25%"},
        {"maxUnavailable": 0},
        {"resources": {"requests": {"cpu": "500m", "memory": "16Gi"}, "limits": {"cpu": 2}}},
    ],
)
def test_well_formed_quantities_pass(spec: Json) -> None:
    InferencePoolSpec.model_validate({"model": "m", **spec})


def test_flow_control_waits_must_fit_the_longest_deadline() -> None:
    message = "onlineMaxWaitSeconds and batchMaxWaitSeconds must not exceed maxDeadlineSeconds"
    for flow in (
        {"maxDeadlineSeconds": 20.0},  # the online default (30) is over it
        {"batchMaxWaitSeconds": 900.0},  # over the default (600)
        {"onlineMaxWaitSeconds": 5.0, "batchMaxWaitSeconds": 50.0, "maxDeadlineSeconds": 40.0},
    ):
        failures = _check(POLICY, {"pools": ["p"], "flowControl": flow})
        assert len(failures) == 1 and message in failures[0], flow
        with pytest.raises(ValueError, match="must not exceed max_deadline_seconds"):
            RoutingPolicySpec.model_validate({"pools": ["p"], "flowControl": flow})
    fine = {"onlineMaxWaitSeconds": 5.0, "batchMaxWaitSeconds": 40.0, "maxDeadlineSeconds": 40.0}
    assert _check(POLICY, {"pools": ["p"], "flowControl": fine}) == []


@pytest.mark.parametrize("name", ["../../kube-system/secrets/victim", "a/b", "UPPER", "x" * 254])
def test_object_names_a_spec_refers_to_are_dns_subdomains(name: str) -> None:
    """A Secret name of `../../kube-system/secrets/victim` made the operator read another
    namespace's Secret with its own rights (the path was not quoted, and `..` collapsed)."""
    from kvgate.operator.kube import resource_path

    policy = {"pools": [{"name": "p"}], "directory": {"backend": "redis",
              "redis": {"url": "redis://r:6379", "password": {"name": name, "key": "k"}}}}  # fmt: skip
    with pytest.raises(ValidationError):
        RoutingPolicySpec.model_validate(policy)
    with pytest.raises(ValidationError):
        InferencePoolSpec.model_validate({"model": "m", "tokenizer": {"configMap": name}})
    schema = _spec_schema(POOL)
    assert "pattern" in schema["properties"]["tokenizer"]["properties"]["configMap"]
    path = resource_path("v1", "Secret", "attacker", name)
    assert path.startswith("/api/v1/namespaces/attacker/secrets/") and path.count("/") == 6
