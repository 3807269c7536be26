"""Classify a request: candidate pools, request class, tenant and cache salt, session.

- **Model → pools**: every pool that serves the requested model name (its model or an alias);
  a request without `model` names the one model of the router's pools, if they serve one.
- **Tenant**: the bearer API key maps to a tenant (keys from config, files or env). With tenants
  configured the router *always* sets the request's `cache_salt` to the tenant's salt, overriding
  any salt the client sent, so a client cannot read another tenant's cache by guessing its salt.
  A tenant's salt is configured, or derived as HMAC-SHA256(salt_secret, tenant name).
  Without tenants, a client's own `cache_salt` passes through (and is hashed with).
- **Class**: the first matching rule, then the tenant's default class, then the configured
  default. The class header (if enabled; `online` or `batch`, else a 400) may always lower a
  request to `batch`, but raise one to `online` only for a tenant with `may_choose_class` (or,
  with `classes.header_may_raise`, a request of no configured tenant): a client cannot lift
  itself into the online pools.
- **Admin**: the admin token is read with the other secrets; empty, unreadable or equal to a
  tenant API key, it is a config error. The admin API warms *as* an explicit tenant
  (`classify_as`), never as whoever its bearer token would map to.
- **Session**: the session header, else (if enabled) the OpenAI `user` field (Anthropic's
  `metadata.user_id`); scoped by tenant.
  An id longer than `sessions.max_id_chars` is replaced by `h:` + the hex BLAKE2b-128 digest
  of it, so the router keeps (session state, reuse buckets, logs) a few bytes per session
  whatever a client sends, and the same long id still names the same session.
- **Previous response**: a Responses API request continuing a response the router's pods
  stored (`previous_response_id` minted by a router, `response_ids.py`) carries that pod's tag:
  it is routed to that pod only. With tenants, an id minted for another tenant is a 404.
- **Pools for a class**: online → online pools (batch pools only if no online pool has a ready
  endpoint and that is allowed); batch → batch pools plus online pools as borrowable (the caller
  admits an online endpoint for batch only while its load is under the borrowing limits).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api.router_config import PoolConfig, RequestClass, RouterConfig
from kvgate.router.core.errors import RouterError, bad_request, not_found_response, shown
from kvgate.router.core.response_ids import UNSCOPED, parse, scope_tag


@dataclass(frozen=True)
class Classification:
    model: str
    request_class: RequestClass
    tenant: str | None
    cache_salt: str | None  # the salt the forwarded body carries and the keys are hashed with
    session_id: str | None
    home_pools: tuple[PoolConfig, ...]  # pools of the request's class
    borrow_pools: tuple[PoolConfig, ...]  # pools usable only under the borrowing limits
    # The tag of the pod holding the response a Responses API request continues
    # (`previous_response_id`, `response_ids.py`): only that pod can serve it.
    pinned_tag: str | None = None


def derive_salt(secret: str, tenant: str) -> str:
    return hmac.new(secret.encode(), tenant.encode(), hashlib.sha256).hexdigest()[:32]


class Classifier:
    """Built from a config (resolving secrets once); `classify` is pure and fast."""

    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        tenants = config.tenants
        secret = tenants.salt_secret.read() if tenants.salt_secret else "kvgate"
        self._tenant_by_key: dict[str, str] = {}
        self._salt_by_tenant: dict[str, str] = {}
        self._class_by_tenant: dict[str, RequestClass] = {}
        self._may_choose_class: set[str] = set()
        for tenant in tenants.tenants:
            for ref in tenant.api_keys:
                key = ref.read()
                if key in self._tenant_by_key and self._tenant_by_key[key] != tenant.name:
                    raise ValueError(f"an API key is listed for two tenants ({tenant.name})")
                self._tenant_by_key[key] = tenant.name
            self._salt_by_tenant[tenant.name] = (
                tenant.cache_salt.read() if tenant.cache_salt else derive_salt(secret, tenant.name)
            )
            if tenant.request_class:
                self._class_by_tenant[tenant.name] = tenant.request_class
            if tenant.may_choose_class:
                self._may_choose_class.add(tenant.name)
        self._tenants_enabled = bool(tenants.tenants)
        self.admin_token = _admin_token(config, self._tenant_by_key)
        self._anonymous_salt = derive_salt(secret, tenants.anonymous_tenant)
        self._pools_by_model: dict[str, list[PoolConfig]] = {}
        for pool in config.pools:
            for name in pool.model_names:
                self._pools_by_model.setdefault(name, []).append(pool)
        # A request without `model` (vLLM serves its one model then) names it, if there is one.
        served = {pool.model for pool in config.pools}
        self._only_model = served.pop() if len(served) == 1 else None

    def models(self) -> list[str]:
        return list(self._pools_by_model)

    def classify(
        self, body: Mapping[str, Any], headers: Mapping[str, str], kind: str = "chat"
    ) -> Classification:
        """`headers` must have lower-case names; `kind`: the API ("chat", "completion",
        "responses", "messages"). Raises RouterError for client mistakes."""
        return self._classify(body, headers, as_tenant=None, by_key=True, kind=kind)

    def pools(self, model: str) -> list[PoolConfig]:
        """Every pool serving `model`, whatever its class."""
        return self._pools_by_model.get(model, [])

    def classify_as(
        self, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str | None
    ) -> Classification:
        """Classify for `tenant` (the admin API), ignoring any API key in `headers`. `None`
        with tenants configured is the anonymous tenant (a 400 with `unknown_key: reject`,
        where no anonymous request exists to warm for)."""
        return self._classify(body, headers, as_tenant=tenant, by_key=False)

    def _classify(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        *,
        as_tenant: str | None,
        by_key: bool,
        kind: str = "chat",
    ) -> Classification:
        model = body.get("model")
        if model is None and self._only_model is not None:
            model = self._only_model
        if not isinstance(model, str) or not model:
            raise RouterError(
                400,
                "`model` is required (the router serves several models)",
                code="missing_model",
                param="model",
            )
        pools = self._pools_by_model.get(model)
        if not pools:
            raise RouterError(
                404,
                f"The model `{shown(model)}` does not exist. Known: {sorted(self._pools_by_model)}",
                code="model_not_found",
                param="model",
            )
        client_salt = body.get("cache_salt")
        if client_salt is not None and not isinstance(client_salt, str):
            raise RouterError(400, "`cache_salt` must be a string", param="cache_salt")
        if by_key:
            tenant, salt = self._tenant(client_salt, headers)
        else:
            tenant, salt = self._named_tenant(as_tenant, client_salt)
        request_class = self._request_class(model, tenant, headers)
        session = self._session(body, headers, tenant, kind)
        continued = None
        if kind == "responses":
            previous = body.get("previous_response_id")
            if previous is not None and not isinstance(previous, str):
                raise bad_request(
                    "`previous_response_id` must be a string", param="previous_response_id"
                )
            continued = parse(previous)
            if continued is not None and continued.scope != self.response_scope(salt):
                raise not_found_response(str(previous), "response_id")  # as vLLM answers
        if request_class == "online":
            home = tuple(p for p in pools if p.pool_class == "online")
            borrow = (
                tuple(p for p in pools if p.pool_class == "batch")
                if self._config.borrowing.online_may_use_batch_pools or not home
                else ()
            )
        else:
            home = tuple(p for p in pools if p.pool_class == "batch")
            borrow = (
                tuple(p for p in pools if p.pool_class == "online")
                if self._config.borrowing.enabled or not home
                else ()
            )
        return Classification(
            model, request_class, tenant, salt, session, home, borrow,
            continued.pod if continued is not None else None,
        )  # fmt: skip

    def response_scope(self, salt: str | None) -> str:
        """The tenant scope of the response ids minted for a request with this cache salt
        (`response_ids.py`): the tenant's tag with tenants configured, else unscoped."""
        return scope_tag(salt) if self._tenants_enabled and salt is not None else UNSCOPED

    def caller_scope(self, headers: Mapping[str, str]) -> str:
        """The tenant scope of a request without a body (a stored response's retrieval), from
        its API key; RouterError 401 as `classify` for an unknown key under `reject`."""
        _tenant, salt = self._tenant(None, headers)
        return self.response_scope(salt)

    def _tenant(
        self, client_salt: str | None, headers: Mapping[str, str]
    ) -> tuple[str | None, str | None]:
        if not self._tenants_enabled:
            return None, client_salt if self._config.tenants.pass_client_salt else None
        key = _bearer(headers)
        tenant = self._tenant_by_key.get(key) if key else None
        if tenant is not None:
            return tenant, self._salt_by_tenant[tenant]
        if self._config.tenants.unknown_key == "reject":
            raise RouterError(
                401,
                "Incorrect or missing API key",
                type="authentication_error",
                code="invalid_api_key",
            )
        return self._config.tenants.anonymous_tenant, self._anonymous_salt

    def _named_tenant(
        self, name: str | None, client_salt: str | None
    ) -> tuple[str | None, str | None]:
        tenants = self._config.tenants
        if not self._tenants_enabled:
            if name is not None:
                raise bad_request("no tenants are configured", param="tenant")
            return None, client_salt if tenants.pass_client_salt else None
        anonymous_allowed = tenants.unknown_key == "anonymous"
        if name is None:
            if not anonymous_allowed:
                raise bad_request(
                    "`tenant` is required (unknown_key is reject: no anonymous requests)",
                    param="tenant",
                )
            name = tenants.anonymous_tenant
        if name in self._salt_by_tenant:
            return name, self._salt_by_tenant[name]
        if name == tenants.anonymous_tenant and anonymous_allowed:
            return name, self._anonymous_salt
        raise bad_request(f"unknown tenant `{shown(name)}`", param="tenant")

    def _request_class(
        self, model: str, tenant: str | None, headers: Mapping[str, str]
    ) -> RequestClass:
        classes = self._config.classes
        assigned = self._assigned_class(model, tenant, headers)
        asked = headers.get(classes.header.lower()) if classes.header else None
        if asked is None:
            return assigned
        if asked not in ("online", "batch"):
            raise RouterError(
                400, f"header {classes.header} must be `online` or `batch`", code="bad_class"
            )
        if asked == "batch" or self._may_raise(tenant):
            return "online" if asked == "online" else "batch"
        return assigned  # `online` asked for a batch request: only lowering is the client's

    def _assigned_class(
        self, model: str, tenant: str | None, headers: Mapping[str, str]
    ) -> RequestClass:
        """The class the configuration gives: first matching rule, tenant, default."""
        for rule in self._config.classes.rules:
            if rule.tenant is not None and rule.tenant != tenant:
                continue
            if rule.model is not None and rule.model != model:
                continue
            if rule.header is not None:
                value = headers.get(rule.header.lower())
                if value is None or (rule.header_value is not None and value != rule.header_value):
                    continue
            return rule.request_class
        if tenant is not None and tenant in self._class_by_tenant:
            return self._class_by_tenant[tenant]
        return self._config.classes.default

    def _may_raise(self, tenant: str | None) -> bool:
        if tenant is not None and tenant in self._salt_by_tenant:
            return tenant in self._may_choose_class
        return self._config.classes.header_may_raise  # no tenants, or the anonymous tenant

    def _session(
        self, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str | None, kind: str
    ) -> str | None:
        sessions = self._config.sessions
        session = headers.get(sessions.header.lower()) if sessions.header else None
        if session is None and sessions.use_openai_user:
            user = body.get("user")
            metadata = body.get("metadata")
            if kind == "messages" and isinstance(metadata, dict):  # Anthropic: no `user`
                user = metadata.get("user_id")
            session = user if isinstance(user, str) and user else None
        if session is None:
            return None
        if len(session) > sessions.max_id_chars:
            digest = hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=16)
            session = "h:" + digest.hexdigest()
        return f"{tenant}/{session}" if tenant else session


def _admin_token(config: RouterConfig, tenant_keys: Mapping[str, str]) -> str | None:
    """The admin bearer token, or None (admin API off). Raises ValueError when it is set but
    unusable: an empty token would open the API to `Authorization: Bearer `, and a token that
    is also an API key would make the admin a tenant."""
    ref = config.admin.token
    if ref is None:
        return None
    token = ref.read().strip()
    if not token:
        raise ValueError("admin.token is empty: refusing to enable the admin API")
    if token in tenant_keys:
        raise ValueError("admin.token is also a tenant API key: give the admin its own token")
    return token


def _bearer(headers: Mapping[str, str]) -> str | None:
    """The API key: `Authorization: Bearer KEY` (OpenAI clients), `api-key: KEY` (Azure's), or
    `x-api-key: KEY` (Anthropic's clients, Claude Code)."""
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("api-key") or headers.get("x-api-key")
