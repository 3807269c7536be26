"""RoutingPolicy sections mirror the router configuration: a field added to or removed from one
must be handled in the other (and in kvgate.operator.render.router)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from kvgate.api import policy as p
from kvgate.api import router_config as rc

# (policy section, router section, router fields deliberately not exposed, policy-only fields)
MIRRORS: list[tuple[type[BaseModel], type[BaseModel], set[str], set[str]]] = [
    (p.ClassRuleSpec, rc.ClassRule, set(), set()),
    (p.ClassesSpec, rc.ClassesConfig, set(), set()),
    (p.BorrowingSpec, rc.BorrowingConfig, set(), set()),
    (p.ScoringSpec, rc.PolicyConfig, set(), set()),
    (p.SessionsSpec, rc.SessionsConfig, {"max_id_chars", "max_state_bytes"}, set()),
    (p.TenantSpec, rc.TenantConfig, set(), set()),
    (p.TenantsSpec, rc.TenantsConfig, {"tenants"}, {"items"}),
    (p.RedisSpec, rc.RedisConfig, {"resync_interval_seconds"}, set()),
    (
        p.DirectorySpec,
        rc.DirectoryConfig,
        {"departed_grace_seconds"},
        set(),
    ),
]


@pytest.mark.parametrize(("ours", "theirs", "hidden", "extra"), MIRRORS)
def test_sections_have_the_same_fields(
    ours: type[BaseModel], theirs: type[BaseModel], hidden: set[str], extra: set[str]
) -> None:
    assert set(ours.model_fields) - extra == set(theirs.model_fields) - hidden


@pytest.mark.parametrize(("ours", "theirs", "hidden", "extra"), MIRRORS)
def test_defaults_agree(
    ours: type[BaseModel], theirs: type[BaseModel], hidden: set[str], extra: set[str]
) -> None:
    for name, field in ours.model_fields.items():
        if name in extra or name not in theirs.model_fields or field.is_required():
            continue
        theirs_default = theirs.model_fields[name].get_default(call_default_factory=True)
        ours_default = field.get_default(call_default_factory=True)
        if isinstance(theirs_default, BaseModel) or isinstance(ours_default, BaseModel):
            continue
        if theirs_default is None and ours_default == "":
            continue  # "" in the CRD stands for "disabled" (None) in the router config
        assert ours_default == theirs_default, f"{ours.__name__}.{name}"
