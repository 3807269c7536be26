"""`POST /admin/warm`: put a prefix into the cache of the pods that would serve it.

Body: a normal chat or completion request (`model` plus `messages` or `prompt`), and optionally
`"targets": "chosen"` (default: the pod the router would pick now) or `"all"` (every ready pod of
the model's pools for the request's class). Each target gets the request with `max_tokens=1`,
non-streaming, with the tenant's salt, so that a changed system prompt or memory block is cached
before users arrive. The answer lists, per pod, the HTTP status and the engine's `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvgate.router.core.errors import bad_request
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.http.upstream import UpstreamError, read_all
from kvgate.router.http.usage import usage_from_json_body

if TYPE_CHECKING:
    from kvgate.router.runtime import RouterRuntime


async def warm(
    runtime: RouterRuntime, body: dict[str, Any], headers: Mapping[str, str]
) -> dict[str, Any]:
    targets = body.pop("targets", "chosen")
    if targets not in ("chosen", "all"):
        raise bad_request("`targets` must be `chosen` or `all`", param="targets")
    kind = "chat" if "messages" in body else "completion"
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    core = runtime.core
    plan = await core.plan(ClientRequest(body, headers, kind))
    cls = plan.classification
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
        "prompt_tokens": plan.keys.prompt_tokens,
        "blocks": len(plan.keys.block_keys),
        "results": list(results),
    }
