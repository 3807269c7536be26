"""`POST /admin/warm`: put a prefix into the cache of the pods that would serve it.

Authorisation: `Authorization: Bearer <admin.token>` (scheme case-insensitive, the token
compared in constant time). The token is read with the config (`classify.Classifier`): an
empty or unreadable one is a config error, so the API is either off (404) or closed (401).

Body: a normal chat or completion request (`model` plus `messages` or `prompt`), and optionally
`"tenant": NAME` (whose salt and class the warm uses: the cache is only useful to that tenant's
requests; default: the anonymous tenant, which must exist, or no tenant when none is configured)
and `"targets": "chosen"` (default: the pod the router would pick now) or `"all"` (every ready
pod of the model's pools for the request's class). The admin's own bearer token is never read as
an API key. Each target gets the request with `max_tokens=1`, non-streaming, with the tenant's
salt, so that a changed system prompt or memory block is cached before users arrive. The answer
names the tenant and lists, per pod, the HTTP status and the engine's `cached_tokens`.

Or, instead of a prompt: `{"top": N, "model": M, "tenant": T}`: the N prefixes of model M that
T's requests shared most (what a pod that joins is warmed with, `core/hot_prefixes.py`), each
sent as token ids to every pod of M's pools; the answer lists, per prefix, its tokens and each
pod's result. Use it after a cache reset, or to re-warm pods with what traffic has shown is hot.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvgate.discovery.endpoints import Endpoint
from kvgate.router.core.errors import RouterError, bad_request
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.core.warmup_pods import WARM_PATH, WarmRequest
from kvgate.router.http.warmer import send_warm

if TYPE_CHECKING:
    from kvgate.router.runtime import RouterRuntime


def is_admin(token: str | None, headers: Mapping[str, str]) -> bool:
    """Whether the request carries the admin token (False when the admin API is off)."""
    try:
        authorize(token, headers.get("authorization"))
    except RouterError:
        return False
    return True


def authorize(token: str | None, authorization: str | None) -> None:
    """Raise unless `authorization` is `Bearer <token>`: 404 if the admin API is off (no
    token), 401 otherwise."""
    if token is None:
        raise RouterError(404, "the admin API is disabled", code="not_found")
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.encode(), token.encode()):
        raise RouterError(
            401, "admin token required", type="authentication_error", code="invalid_admin_token"
        )


async def warm(
    runtime: RouterRuntime, body: dict[str, Any], headers: Mapping[str, str]
) -> dict[str, Any]:
    tenant = body.pop("tenant", None)
    if tenant is not None and not isinstance(tenant, str):
        raise bad_request("`tenant` must be a string", param="tenant")
    if "top" in body:
        return await _warm_top(runtime, body, headers, tenant)
    targets = body.pop("targets", "chosen")
    if targets not in ("chosen", "all"):
        raise bad_request("`targets` must be `chosen` or `all`", param="targets")
    kind = "chat" if "messages" in body else "completion"
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    core = runtime.core
    cls = core.state.classifier.classify_as(body, headers, tenant)
    # Recorded nowhere yet: the pods that computed the prefix are recorded once they have.
    plan = await core.explain(ClientRequest(body, headers, kind, classification=cls))
    if targets == "chosen":
        endpoints = [plan.endpoint]
    else:
        endpoints = [ep for pool in cls.home_pools for ep in core.endpoints.in_pool(pool.key)]
    forward = {**body, "max_tokens": 1, "stream": False}
    forward.pop("stream_options", None)
    forward.pop("max_completion_tokens", None)
    if cls.cache_salt is not None:
        forward["cache_salt"] = cls.cache_salt
    payload = json.dumps(forward).encode()
    limits = runtime.config.limits

    async def one(ep: Endpoint) -> dict[str, Any]:
        result = await send_warm(
            runtime.upstream,
            ep.spec.url,
            path,
            payload,
            limits,
            headers=core.state.pod_headers(ep.pool),
        )
        return {"endpoint": ep.id, **result}

    results = await asyncio.gather(*(one(ep) for ep in endpoints))
    for ep, result in zip(endpoints, results, strict=True):
        # History only where the prefix was computed, on a pod still there: one that left
        # meanwhile would be listed again, its entries never collected.
        pool = core.state.pools.get(ep.pool)
        if result["status"] == 200 and pool is not None and core.endpoints.get(ep.id) is ep:
            await core.learner.routed(replace(plan, endpoint=ep, pool=pool))
    return {
        "model": cls.model,
        "tenant": cls.tenant,
        "prompt_tokens": plan.keys.prompt_tokens,
        "blocks": len(plan.keys.block_keys),
        "results": list(results),
    }


async def _warm_top(
    runtime: RouterRuntime, body: dict[str, Any], headers: Mapping[str, str], tenant: str | None
) -> dict[str, Any]:
    """`{"top": N, "model": M, "tenant": T}`: the N hottest prefixes the router has seen for
    model M and tenant T (`core/hot_prefixes.py`), each sent to every ready pod of M's pools."""
    top = body.pop("top")
    extra = sorted(set(body) - {"model", "targets"})
    if extra:
        raise bad_request(f"unexpected fields with `top`: {extra}", param=extra[0])
    if body.pop("targets", "all") != "all":
        raise bad_request("`top` warms every pod: `targets` must be `all`", param="targets")
    limit = runtime.config.warmup.remembered_prefixes
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= max(limit, 1):
        raise bad_request(f"`top` must be an integer from 1 to {max(limit, 1)}", param="top")
    core = runtime.core
    cls = core.state.classifier.classify_as(body, headers, tenant)
    now = core.clock()
    limits = runtime.config.limits
    prefixes = []
    for pool in cls.home_pools:
        hot = core.warmup.hot.top(
            pool.key, top, now, model=cls.model, tenant=cls.tenant, any_tenant=False
        )
        for prefix in hot:
            warm_request = WarmRequest("", pool.key, prefix)
            payload = json.dumps(warm_request.body(), separators=(",", ":")).encode()
            endpoints = core.endpoints.in_pool(pool.key)

            async def one(ep: Endpoint, payload: bytes = payload) -> dict[str, Any]:
                result = await send_warm(
                    runtime.upstream,
                    ep.spec.url,
                    WARM_PATH,
                    payload,
                    limits,
                    headers=core.state.pod_headers(ep.pool),
                )
                return {"endpoint": ep.id, **result}

            results = await asyncio.gather(*(one(ep) for ep in endpoints))
            prefixes.append(
                {"pool": pool.key, "prompt_tokens": prefix.token_count, "results": list(results)}
            )
    return {"model": cls.model, "tenant": cls.tenant, "top": top, "prefixes": prefixes}
