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
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvgate.router.core.errors import RouterError, bad_request
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.http.upstream import UpstreamError, read_all
from kvgate.router.http.usage import usage_from_json_body

if TYPE_CHECKING:
    from kvgate.router.runtime import RouterRuntime


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
    targets = body.pop("targets", "chosen")
    if targets not in ("chosen", "all"):
        raise bad_request("`targets` must be `chosen` or `all`", param="targets")
    tenant = body.pop("tenant", None)
    if tenant is not None and not isinstance(tenant, str):
        raise bad_request("`tenant` must be a string", param="tenant")
    kind = "chat" if "messages" in body else "completion"
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    core = runtime.core
    cls = core.state.classifier.classify_as(body, headers, tenant)
    plan = await core.plan(ClientRequest(body, headers, kind, classification=cls))
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
    timeout = runtime.config.limits.first_byte_timeout_seconds

    async def one(url: str, endpoint_id: str) -> dict[str, Any]:
        try:
            response = await runtime.upstream.request(
                "POST",
                url + path,
                payload,
                [(b"content-type", b"application/json")],
                connect_timeout=runtime.config.limits.connect_timeout_seconds,
                head_timeout=timeout,
            )
            content = await read_all(response)
        except UpstreamError as exc:
            return {"endpoint": endpoint_id, "status": None, "error": str(exc)}
        usage = usage_from_json_body(content)
        return {
            "endpoint": endpoint_id,
            "status": response.status,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "cached_tokens": usage.cached_tokens if usage else None,
        }

    results = await asyncio.gather(*(one(ep.spec.url, ep.id) for ep in endpoints))
    for ep in endpoints:
        await core.learner.routed(replace(plan, endpoint=ep, pool=core.state.pools[ep.pool]))
    return {
        "model": cls.model,
        "tenant": cls.tenant,
        "prompt_tokens": plan.keys.prompt_tokens,
        "blocks": len(plan.keys.block_keys),
        "results": list(results),
    }
