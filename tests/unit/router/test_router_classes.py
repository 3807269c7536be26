"""Request classes: the class header may only lower priority unless the tenant may choose; the
admin API classifies as an explicit tenant; the admin token is checked at load."""

from __future__ import annotations

import pytest

from kvgate.api.router_config import RouterConfig
from kvgate.router.core.classify import Classifier
from kvgate.router.core.errors import RouterError

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
POOLS = [
    {"name": "on", "model": "m", "endpoints": {"static": [{"url": "http://a:1"}]}},
    {"name": "off", "model": "m", "pool_class": "batch",
     "endpoints": {"static": [{"url": "http://b:1"}]}},
]  # fmt: skip
TENANTS = [
    {"name": "batchy", "api_keys": [{"value": "k-batchy"}], "request_class": "batch"},
    {"name": "chooser", "api_keys": [{"value": "k-chooser"}], "request_class": "batch",
     "may_choose_class": True},
    {"name": "plain", "api_keys": [{"value": "k-plain"}]},
]  # fmt: skip
RULES = [{"request_class": "batch", "header": "x-job"}]


def _classifier(tenants: bool = True, **classes: object) -> Classifier:
    data: dict[str, object] = {"pools": POOLS, "classes": {"rules": RULES, **classes}}
    if tenants:
        data["tenants"] = {"tenants": TENANTS}
    return Classifier(RouterConfig.model_validate(data))


def _headers(key: str | None, cls: str | None, job: bool) -> dict[str, str]:
    headers = {}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if cls:
        headers["x-kvgate-class"] = cls
    if job:
        headers["x-job"] = "1"
    return headers


# (tenants configured, classes settings, API key, class header, x-job rule header) -> class
CLASS_TABLE = [
    # a batch tenant cannot lift itself; lowering always works
    (True, {}, "k-batchy", None, False, "batch"),
    (True, {}, "k-batchy", "online", False, "batch"),
    (True, {}, "k-batchy", "batch", False, "batch"),
    # a tenant allowed to choose may raise, overriding its class and the rules
    (True, {}, "k-chooser", None, False, "batch"),
    (True, {}, "k-chooser", "online", False, "online"),
    (True, {}, "k-chooser", "online", True, "online"),
    # an online tenant: the header lowers; a rule lowers; the header cannot undo a rule
    (True, {}, "k-plain", None, False, "online"),
    (True, {}, "k-plain", "batch", False, "batch"),
    (True, {}, "k-plain", None, True, "batch"),
    (True, {}, "k-plain", "online", True, "batch"),
    # the anonymous tenant follows classes.header_may_raise
    (True, {}, None, "online", True, "batch"),
    (True, {"header_may_raise": True}, None, "online", True, "online"),
    (True, {"header_may_raise": True}, "k-batchy", "online", False, "batch"),
    # no tenants: the same rule for everyone
    (False, {}, None, "online", True, "batch"),
    (False, {}, None, "batch", False, "batch"),
    (False, {"header_may_raise": True}, None, "online", True, "online"),
    (False, {"default": "batch"}, None, "online", False, "batch"),
    # the header switched off is ignored both ways
    (True, {"header": None}, "k-plain", "batch", False, "online"),
    (True, {"header": None}, "k-chooser", "online", False, "batch"),
]


@pytest.mark.parametrize(("tenants", "classes", "key", "asked", "job", "expected"), CLASS_TABLE)
def test_class_header_only_lowers_unless_the_tenant_may_choose(
    tenants, classes, key, asked, job, expected
):
    cls = _classifier(tenants, **classes).classify(BODY, _headers(key, asked, job))
    assert cls.request_class == expected
    assert {p.pool_class for p in cls.home_pools} == {expected}


def test_a_bad_class_header_is_a_400_even_for_a_batch_tenant():
    with pytest.raises(RouterError) as info:
        _classifier().classify(BODY, _headers("k-batchy", "urgent", False))
    assert info.value.status == 400 and info.value.code == "bad_class"


def test_classify_as_names_the_tenant_and_ignores_the_bearer_key():
    c = _classifier()
    as_batchy = c.classify_as(BODY, {"authorization": "Bearer k-plain"}, "batchy")
    own = c.classify(BODY, {"authorization": "Bearer k-batchy"})
    assert (as_batchy.tenant, as_batchy.cache_salt) == ("batchy", own.cache_salt)
    assert as_batchy.request_class == "batch"
    anonymous = c.classify_as(BODY, {"authorization": "Bearer k-plain"}, None)
    assert anonymous.tenant == "anonymous"
    assert anonymous.cache_salt == c.classify(BODY, {}).cache_salt
    with pytest.raises(RouterError) as info:
        c.classify_as(BODY, {}, "nobody")
    assert info.value.status == 400 and info.value.param == "tenant"


def test_classify_as_without_anonymous_or_without_tenants():
    reject = Classifier(
        RouterConfig.model_validate(
            {"pools": POOLS, "tenants": {"tenants": TENANTS, "unknown_key": "reject"}}
        )
    )
    with pytest.raises(RouterError) as info:
        reject.classify_as(BODY, {}, None)
    assert info.value.status == 400
    with pytest.raises(RouterError):
        reject.classify_as(BODY, {}, "anonymous")  # no anonymous tenant exists here
    none = _classifier(tenants=False)
    assert none.classify_as({**BODY, "cache_salt": "mine"}, {}, None).cache_salt == "mine"
    with pytest.raises(RouterError):
        none.classify_as(BODY, {}, "batchy")


def _admin(token: dict[str, str]) -> RouterConfig:
    return RouterConfig.model_validate(
        {"pools": POOLS, "tenants": {"tenants": TENANTS}, "admin": {"token": token}}
    )


def test_admin_token_is_read_at_load(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    assert Classifier(_admin({"file": str(path)})).admin_token == "s3cret"
    assert Classifier(RouterConfig.model_validate({"pools": POOLS})).admin_token is None
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        Classifier(_admin({"file": str(path)}))
    with pytest.raises(ValueError, match="cannot read"):
        Classifier(_admin({"file": str(tmp_path / "missing")}))
    with pytest.raises(ValueError, match="tenant API key"):
        Classifier(_admin({"value": "k-plain"}))
