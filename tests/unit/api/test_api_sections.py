"""One model per configuration section, read by the router (snake_case) and written in a
RoutingPolicy (camelCase): a field set in a policy reaches the router's config unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from kvgate.api import router_config as rc
from kvgate.api.base import DataKeyRef
from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec
from kvgate.api.tenants import TenantsSettings
from kvgate.operator.render.config import (
    SelectedPool,
    data_env_name,
    router_config,
    router_config_yaml,
    secret_env_name,
)

#: RoutingPolicy section -> RouterConfig section with the same model.
SHARED = {
    "classes": "classes",
    "borrowing": "borrowing",
    "flow_control": "flow_control",
    "scoring": "policy",
    "sessions": "sessions",
    "tenants": "tenants",
    "directory": "directory",
}

#: Every shared field set to something other than its default (camelCase, as a user writes it).
FULL_POLICY: dict[str, Any] = {
    "pools": ["p"],
    "classes": {
        "default": "batch",
        "header": "x-class",
        "headerMayRaise": True,
        "rules": [
            {
                "requestClass": "online",
                "tenant": "t",
                "model": "m",
                "header": "h",
                "headerValue": "v",
            }
        ],
    },
    "borrowing": {
        "enabled": False,
        "maxWaitingRequests": 3,
        "maxKvCacheUsage": 0.5,
        "maxRunningRequests": 4,
        "onlineMayUseBatchPools": False,
    },
    "flowControl": {
        "enabled": False,
        "maxWaitingRequests": 2,
        "maxKvCacheUsage": 0.5,
        "maxPendingPrefillTokens": 1000,
        "fairShareWindowSeconds": 0.0,
        "prefillTimeWeight": 0.5,
        "maxQueuedRequests": 10,
        "maxQueuedBytes": 4096,
        "onlineMaxWaitSeconds": 1.0,
        "batchMaxWaitSeconds": 2.0,
        "deadlineHeader": "x-deadline",
        "maxDeadlineSeconds": 3.0,
    },
    "scoring": {"name": "p2c", "params": {"w": 1}, "maxAffinityWaitSeconds": 0.5, "seed": 7},
    "sessions": {
        "header": "x-s",
        "useOpenaiUser": False,
        "maxSessions": 5,
        "ttlSeconds": 9.0,
        "maxIdChars": 64,
        "maxStateBytes": 1024,
    },
    "tenants": {
        "items": [
            {
                "name": "t",
                "apiKeys": [{"name": "keys", "key": "t"}],
                "cacheSalt": {"name": "salts", "key": "t"},
                "requestClass": "batch",
                "mayChooseClass": True,
                "priority": 3,
                "weight": 2.0,
            }
        ],
        "unknownKey": "reject",
        "anonymousTenant": "anon",
        "saltSecret": {"name": "salt", "key": "s"},
        "passClientSalt": False,
    },
    "directory": {
        "backend": "redis",
        "redis": {
            "url": "redis://r:6379/1",
            "keyPrefix": "kv",
            "urlSecret": {"name": "redis", "key": "url"},
            "password": {"name": "redis", "key": "password"},
            "cluster": True,
            "caBundle": {"configMap": "redis-ca", "key": "ca.crt"},
            "socketTimeoutSeconds": 0.2,
            "resyncIntervalSeconds": 3.0,
        },
        "embeddedIndexer": False,
        "approximateTtlSeconds": 60.0,
    },
}

POOL = SelectedPool("p", "ns", InferencePoolSpec.model_validate({"model": "m", "image": "i"}))


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


# Router-config fields a RoutingPolicy does not carry (the operator's pods never need them).
ROUTER_ONLY = {"directory": {"kv_events"}}


def _origins(model: type[BaseModel]) -> list[type]:
    return [
        getattr(base, "__pydantic_generic_metadata__", {}).get("origin") or base
        for base in model.__mro__
    ]


@pytest.mark.parametrize(("ours", "theirs"), SHARED.items())
def test_policy_sections_are_the_router_models(ours: str, theirs: str) -> None:
    policy_type = RoutingPolicySpec.model_fields[ours].annotation
    router_type = rc.RouterConfig.model_fields[theirs].annotation
    assert isinstance(policy_type, type) and isinstance(router_type, type)
    origin = policy_type.__pydantic_generic_metadata__["origin"] or policy_type
    assert origin in _origins(router_type)  # the same model, or the router's extension of it
    assert _fields(policy_type) == _fields(router_type) - ROUTER_ONLY.get(ours, set())


def test_full_policy_sets_every_shared_field() -> None:
    """The fixture below stays complete: a new field must be added to it (and so tested)."""
    spec = RoutingPolicySpec.model_validate(FULL_POLICY)

    def unset(model: BaseModel, path: str) -> list[str]:
        out = [f"{path}.{n}" for n in type(model).model_fields if n not in model.model_fields_set]
        for name in model.model_fields_set:
            value = getattr(model, name)
            for item in value if isinstance(value, list) else [value]:
                # a DataKeyRef names a Secret or a ConfigMap, never both
                if isinstance(item, BaseModel) and not isinstance(item, DataKeyRef):
                    out += unset(item, f"{path}.{name}")
        return out

    assert [f for s in SHARED for f in unset(getattr(spec, s), s)] == []


def test_every_policy_field_reaches_the_router_config() -> None:
    spec = RoutingPolicySpec.model_validate(FULL_POLICY)
    config = router_config(spec, [POOL])
    for ours, theirs in SHARED.items():
        policy_side = getattr(spec, ours).model_dump()
        router_side = getattr(config, theirs).model_dump(exclude=ROUTER_ONLY.get(ours))
        assert _without_secrets(policy_side) == _without_secrets(router_side), ours
    # Secrets arrive as the environment variables the router container is given.
    redis = config.directory.redis.password
    assert redis == rc.SecretRef(env=secret_env_name(spec.directory.redis.password))  # type: ignore[arg-type]
    url = config.directory.redis.url_secret
    assert url == rc.SecretRef(env=secret_env_name(spec.directory.redis.url_secret))  # type: ignore[arg-type]
    # Other data (a ConfigMap's key) arrives the same way.
    ca = config.directory.redis.ca_bundle
    assert ca == rc.SecretRef(env=data_env_name(spec.directory.redis.ca_bundle))  # type: ignore[arg-type]
    tenant = config.tenants.tenants[0]
    assert tenant.api_keys[0].env == secret_env_name(spec.tenants.tenants[0].api_keys[0])


def _without_secrets(value: Any) -> Any:
    """Replace every secret (a {name, key} Secret key, or a {value, file, env} SecretRef) and
    every Secret-or-ConfigMap key ({secret, config_map, key})."""
    if isinstance(value, dict):
        if set(value) in ({"name", "key"}, {"value", "file", "env"}):
            return "<secret>"
        if set(value) == {"secret", "config_map", "key"}:
            return "<secret>"
        return {k: _without_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def test_the_router_reads_both_spellings_and_writes_snake_case() -> None:
    snake = {"max_waiting_requests": 2, "online_may_use_batch_pools": False}
    camel = {"maxWaitingRequests": 2, "onlineMayUseBatchPools": False}
    assert rc.BorrowingConfig.model_validate(snake) == rc.BorrowingConfig.model_validate(camel)
    pools = [{"name": "p", "model": "m", "endpoints": {"static": [{"url": "http://a:1"}]}}]
    config = rc.RouterConfig.model_validate({"pools": pools, "borrowing": camel})
    text = router_config_yaml(config)
    assert "max_waiting_requests: 2" in text and "maxWaitingRequests" not in text
    assert rc.parse_router_config(text) == config


def test_tenants_are_items_in_a_policy_and_tenants_in_the_router_file() -> None:
    spec = RoutingPolicySpec.model_validate(FULL_POLICY)
    data = yaml.safe_load(router_config_yaml(router_config(spec, [POOL])))
    assert [t["name"] for t in data["tenants"]["tenants"]] == ["t"]
    by_name = rc.TenantsConfig.model_validate({"tenants": [{"name": "a"}]})
    assert by_name == rc.TenantsConfig.model_validate({"items": [{"name": "a"}]})


@pytest.mark.parametrize("section", [rc.ClassesConfig, rc.SessionsConfig])
def test_an_empty_header_disables_it(section: type[BaseModel]) -> None:
    assert section.model_validate({"header": ""}).header is None  # type: ignore[attr-defined]
    assert section.model_validate({"header": None}).header is None  # type: ignore[attr-defined]


def test_errors_name_fields_as_the_router_file_spells_them() -> None:
    with pytest.raises(ValidationError, match="max_kv_cache_usage"):
        rc.BorrowingConfig.model_validate({"maxKvCacheUsage": 2})


@pytest.mark.parametrize(
    ("directory", "ok"),
    [
        ({"embedded_indexer": False, "backend": "redis"}, True),
        ({"embedded_indexer": False}, False),
        ({"embedded_indexer": True}, True),
    ],
)
def test_a_separate_indexer_needs_redis_in_the_router_file_too(
    directory: dict[str, Any], ok: bool
) -> None:
    if ok:
        rc.DirectoryConfig.model_validate(directory)
    else:
        with pytest.raises(ValidationError, match="needs backend: redis"):
            rc.DirectoryConfig.model_validate(directory)


def test_secrets_are_named_by_the_section_parameter() -> None:
    with pytest.raises(ValidationError):  # a RoutingPolicy cannot carry an inline secret
        RoutingPolicySpec.model_validate(
            {"pools": ["p"], "tenants": {"saltSecret": {"value": "plain"}}}
        )
    assert rc.TenantsConfig.model_validate({"salt_secret": {"value": "plain"}}).salt_secret
    assert TenantsSettings in type(rc.TenantsConfig()).__mro__
