"""The router's ASGI application (raw ASGI: the hot path has no framework layers).

Routes:
- `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`, and
  `POST /v1/messages` (Anthropic's Messages API, as vLLM serves it; errors in its shape): route
  and proxy (`proxy.py`);
- `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`: relayed to the pod that stored
  the response (`core/response_ids.py`);
- `POST /v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank` (and their `/v1`, `/v2`
  spellings): vLLM's pooling models, routed and proxied;
- `POST /v1/messages/count_tokens`, `/tokenize`, `/detokenize`: relayed to the pod the body
  would be routed to;
- `GET /v1/models`: the union of the models of every pool;
- `GET /health` (process alive), `GET /ready` (at least one endpoint in rotation);
- `GET /metrics`: Prometheus text from the app's own registry;
- `GET|POST /debug/route`: the decision for a body, explained, without sending it;
- `GET /debug/warm`: every pod's warm-up phase and the hottest prefixes (`core/warmup.py`);
- `POST /admin/warm`: bearer-token authenticated prefix warming (`admin.py`).

Every error is an OpenAI-shaped JSON error (Anthropic-shaped on `/v1/messages`); client mistakes
are 4xx. A client that disconnects cancels the request, which closes the upstream connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, urlencode

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvgate.router.core.errors import (
    RouterError,
    anthropic_error_body,
    error_bytes,
    not_found_response,
)
from kvgate.router.core.learn import status_label
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.core.response_ids import mint, parse, tagged
from kvgate.router.core.routing import RoutePlan
from kvgate.router.http.proxy import plan_headers
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.admin import authorize, is_admin, warm
from kvgate.router.server.body import (
    PARSE_IN_THREAD_BYTES,
    ClientDisconnected,
    parse_json_object,
    read_body,
)
from kvgate.router.server.drain import Drain
from kvgate.router.server.forward import forward_body

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_POOLING = (
    "/v1/embeddings", "/v2/embed", "/pooling", "/classify",
    "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
)  # fmt: skip
# Not client traffic: the kubelet's probes and Prometheus' scrapes (kvgate_router_responses_total).
_PROBES = frozenset({"/health", "/ready", "/metrics"})
_KINDS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    # vLLM's pooling models (embeddings, classification, scores, reranking): routed by load
    # and, for an `input`, by approximate keys of it.
    **dict.fromkeys(_POOLING, "pooling"),
}
# Cheap CPU work on any pod of the model, nothing learned: to the pod the router would choose.
_RELAYED = ("/v1/messages/count_tokens", "/tokenize", "/detokenize")
_STORED_RESPONSE = "/v1/responses/"
_JSON = [(b"content-type", b"application/json")]


class RouterApp:
    """`RouterApp(runtime)` is an ASGI callable; lifespan starts and stops the runtime."""

    def __init__(self, runtime: RouterRuntime) -> None:
        self.runtime = runtime
        metrics = runtime.metrics

        def responded(path: str, status: int) -> None:
            if path not in _PROBES:
                metrics.child(metrics.responses, status_label(status)).inc()

        self.drain = Drain(
            on_cut=lambda kind: metrics.shutdown_cut_requests.labels(kind).inc(),
            on_start=responded,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.drain.run(self._http, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.runtime.start()
                except Exception as exc:
                    log.exception("router failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.runtime.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if len(path) > 1 and path.endswith("/"):
            # vLLM (FastAPI) redirects there, and the SDKs follow; the pod gets it so too (its
            # redirect would send the client to the pod itself)
            path = path[:-1]
            scope = {**scope, "path": path}
        method: str = scope["method"]
        request_id = _header(scope, b"x-request-id")
        try:
            if path in _KINDS:
                if method != "POST":
                    raise RouterError(405, f"use POST for {path}", code="method_not_allowed")
                request_id = request_id or uuid.uuid4().hex
                await self._completions(scope, receive, send, _KINDS[path], request_id)
            elif path in _RELAYED:
                if method != "POST":
                    raise RouterError(405, f"use POST for {path}", code="method_not_allowed")
                request_id = request_id or uuid.uuid4().hex
                await self._relayed(scope, receive, send, request_id)
            elif path.startswith(_STORED_RESPONSE):
                request_id = request_id or uuid.uuid4().hex
                rest = path[len(_STORED_RESPONSE) :]
                await self._stored_response(scope, receive, send, rest, request_id)
            elif path == "/v1/models" and method == "GET":
                await _json(send, 200, self._models())
            elif path == "/health":
                await _json(send, 200, {"status": "ok"})
            elif path == "/ready":
                ready = self.runtime.ready()
                await _json(send, 200 if ready else 503, {"ready": ready})
            elif path == "/metrics" and method == "GET":
                core = self.runtime.core
                now = core.clock()
                core.warmup.advance_all(now)  # the warm phases as of now
                core.metrics.sweep(now)  # the series of pods and pools gone past their grace
                payload = generate_latest(self.runtime.metrics.registry)
                await _raw(send, 200, payload, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
            elif path == "/debug/route" and method in ("GET", "POST"):
                await self._debug_route(scope, receive, send)
            elif path == "/debug/warm" and method == "GET":
                core = self.runtime.core
                admin = is_admin(core.state.classifier.admin_token, _headers(scope))
                state = core.warmup.debug(core.clock(), core.endpoints.all(), tenants=admin)
                await _json(send, 200, state)
            elif path == "/admin/warm" and method == "POST":
                await self._admin_warm(scope, receive, send)
            else:
                raise RouterError(404, f"no route {method} {path}", code="not_found")
        except RouterError as err:
            body = (
                anthropic_error_body(err.status, err.message)
                if path.startswith("/v1/messages")
                else err.body()
            )
            headers = _JSON + err.headers()
            if request_id:  # the client's, or the one its request was logged with
                headers.append((b"x-request-id", request_id.encode("latin-1")))
            await _raw(send, err.status, json.dumps(body).encode(), headers)
        except ClientDisconnected:
            # The client's doing, and frequent under load: a counter and a DEBUG line.
            self.runtime.metrics.client_disconnects.labels("body").inc()
            log.debug("client disconnected while sending %s %s", method, path)
        except Exception:
            # A bug, never the client's doing: log it, and answer in the OpenAI shape if the
            # response has not started (otherwise the server closes the connection).
            log.exception("unhandled error serving %s %s", method, path)
            payload = error_bytes("internal router error", "server_error")
            if path.startswith("/v1/messages"):
                payload = json.dumps(anthropic_error_body(500, "internal router error")).encode()
            with contextlib.suppress(Exception):
                await _raw(send, 500, payload, _JSON)

    def _models(self) -> dict[str, Any]:
        """Model cards as vLLM writes them: a LoRA adapter's `root` is its path and its
        `parent` the base model; `max_model_len` where the pools' engines say it (the least)."""
        created = int(time.time())
        classifier = self.runtime.core.state.classifier
        cards = []
        for name in classifier.models():
            pools = classifier.pools(name)
            lora = next((a for pool in pools if (a := pool.lora_for(name)) is not None), None)
            lengths = [p.engine.max_model_len for p in pools if p.engine.max_model_len]
            cards.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "kvgate",
                    "root": lora.path if lora else pools[0].model,
                    "parent": pools[0].model if lora else None,
                    "max_model_len": min(lengths) if lengths else None,
                }
            )
        return {"object": "list", "data": cards}

    async def _read_json(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        return (await self._read_body(scope, receive))[1]

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, dict[str, Any]]:
        limits = self.runtime.config.limits
        declared = _header(scope, b"content-length")
        raw = await read_body(receive, declared, limits.max_body_bytes)
        if len(raw) < PARSE_IN_THREAD_BYTES:
            return raw, parse_json_object(raw, limits.max_json_depth)
        # Its numpy passes release the GIL: the event loop serves others meanwhile (body.py).
        return raw, await asyncio.to_thread(parse_json_object, raw, limits.max_json_depth)

    async def _completions(
        self, scope: Scope, receive: Receive, send: Send, kind: str, request_id: str
    ) -> None:
        raw, body = await self._read_body(scope, receive)
        request = ClientRequest(body, _headers(scope), kind, len(raw), request_id)
        stream = body.get("stream") is True
        # Responses and Messages streams always end with their usage.
        strip_usage = kind in ("chat", "completion") and _needs_usage(body, stream)
        bodies: dict[tuple[bool, bool], bytes] = {}
        # A Responses API answer's id names the pod that wrote it (`response_ids.py`), unless
        # the client chose the id.
        names_pod = kind == "responses" and "request_id" not in body
        if kind == "responses" and parse(body.get("request_id")) is not None:
            # vLLM stores a response under its id, over any response stored there before.
            raise RouterError(
                400, "`request_id` values of this form are the router's own", param="request_id"
            )
        classifier = self.runtime.core.state.classifier

        def forward(plan: RoutePlan) -> bytes:
            """The body for the pool `plan` chose (a retry may go to another pool)."""
            if names_pod:
                scope = classifier.response_scope(plan.classification.cache_salt)
                return forward_body(
                    raw, body, plan.classification.cache_salt, False,
                    cache_ops=plan.pool.engine.cache_ops,
                    response_id=mint(plan.endpoint.id, scope),
                )  # fmt: skip
            ops, added = plan.pool.engine.cache_ops, plan.added_cache
            if (ops, added is not None) not in bodies:
                bodies[ops, added is not None] = forward_body(
                    raw,
                    body if added is None else {**body, "cache": added},
                    plan.classification.cache_salt,
                    strip_usage,
                    cache_ops=ops,
                    changed=added is not None,
                )
            return bodies[ops, added is not None]

        async def route_and_forward() -> None:
            plan = await self.runtime.core.route(request)
            await self.runtime.proxy.forward(
                request,
                plan,
                scope["path"],
                forward,
                stream=stream,
                strip_usage=strip_usage,
                send=send,
            )

        # A client that disconnects takes a queued request out of the queue, or closes the
        # upstream connection (the pod aborts the request).
        if await _until_disconnect(receive, route_and_forward()):
            log.info("request %s: client disconnected; upstream cancelled", request.request_id)

    async def _stored_response(
        self, scope: Scope, receive: Receive, send: Send, rest: str, request_id: str
    ) -> None:
        """`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`, relayed to the pod
        whose tag the id carries (`response_ids.py`); 404 for an id no router minted, minted
        for another tenant, or whose pod has left."""
        method = scope["method"]
        response_id, _, action = rest.partition("/")
        if action not in ("", "cancel"):
            raise RouterError(404, f"no route {method} {scope['path']}", code="not_found")
        wanted = "GET" if action == "" else "POST"
        if method != wanted:
            raise RouterError(405, f"use {wanted} for {scope['path']}", code="method_not_allowed")
        named = parse(response_id)
        caller = self.runtime.core.state.classifier.caller_scope(_headers(scope))
        pod = None
        if named is not None and named.scope == caller:  # another tenant's: as if unknown
            pod = tagged(self.runtime.core.endpoints.all(), named.pod)
        if pod is None:
            raise not_found_response(response_id, "response_id")
        target = f"{_STORED_RESPONSE}{response_id}" + ("/cancel" if action else "")
        if action == "":
            target += _retrieve_query(scope.get("query_string", b""))
        relayed = self.runtime.proxy.relay(pod, method, target, send, request_id=request_id)
        await _until_disconnect(receive, relayed)

    async def _relayed(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        """A token count (Anthropic's `count_tokens`, vLLM's `/tokenize`, `/detokenize`): to
        the pod the router would choose for it (nothing recorded: no prompt is computed)."""
        raw, body = await self._read_body(scope, receive)
        path = scope["path"]
        kind = "messages" if path.startswith("/v1/messages") else "pooling"
        plan = await self.runtime.core.explain(ClientRequest(body, _headers(scope), kind, len(raw)))
        relayed = self.runtime.proxy.relay(
            plan.endpoint, "POST", path, send, raw, request_id=request_id
        )
        await _until_disconnect(receive, relayed)

    async def _debug_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw, body = await self._read_body(scope, receive)
        kind = _debug_api(scope.get("query_string", b""), body)
        plan = await self.runtime.core.explain(ClientRequest(body, _headers(scope), kind, len(raw)))
        cls = plan.classification
        result = {
            "model": cls.model,
            "request_class": cls.request_class,
            "tenant": cls.tenant,
            "session": cls.session_id,
            "prompt_tokens": plan.keys.prompt_tokens,
            "blocks": len(plan.keys.block_keys),
            "keys_exact": plan.keys.exact,
            "expected_output_tokens": round(plan.expected_output_tokens, 1),
            "output_ratio": round(self.runtime.core.output_lengths.output_ratio(plan.pool.key), 3),
            "decision": plan.decision.to_dict(),
            "decision_seconds": round(plan.decision_seconds, 6),
        }
        await _json(send, 200, result, plan_headers(plan, uuid.uuid4().hex))

    async def _admin_warm(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        authorize(self.runtime.core.state.classifier.admin_token, headers.get("authorization"))
        body = await self._read_json(scope, receive)
        result = await warm(self.runtime, body, headers)
        await _json(send, 200, result)


def _debug_api(query: bytes, body: dict[str, Any]) -> str:
    """The API a body to explain is for: `?api=chat|completion|responses|messages|pooling`, else
    guessed (Anthropic's has a top-level `system`, the Responses API's an `input`)."""
    try:
        fields = parse_qs(query.decode("latin-1"), max_num_fields=8)
    except ValueError:
        raise RouterError(400, "at most 8 query fields") from None
    named = fields.get("api", [None])[-1]
    if named is not None:
        if named not in ("chat", "completion", "responses", "messages", "pooling"):
            raise RouterError(400, "`api` must be chat, completion, responses, messages or pooling")
        return named
    if "messages" in body:
        return "messages" if "system" in body else "chat"
    return "responses" if "input" in body else "completion"


_TRUE = frozenset(("1", "true", "t", "yes", "y", "on"))  # as FastAPI reads a bool
_FALSE = frozenset(("0", "false", "f", "no", "n", "off"))
_INTEGER = re.compile(r"-?[0-9]{1,18}")


def _retrieve_query(raw: bytes) -> str:
    """The retrieval's query as vLLM reads it (`stream`, `starting_after`), validated and
    written anew: nothing else of the client's query reaches the pod. RouterError 400."""
    try:
        query = parse_qs(raw.decode("latin-1"), max_num_fields=8, strict_parsing=False)
    except ValueError as exc:
        raise RouterError(400, f"malformed query string: {exc}") from None
    kept: dict[str, str] = {}
    stream = query.get("stream", [None])[-1]
    if stream is not None:
        if stream.lower() not in _TRUE | _FALSE:
            raise RouterError(400, "`stream` must be true or false", param="stream")
        kept["stream"] = "true" if stream.lower() in _TRUE else "false"
    after = query.get("starting_after", [None])[-1]
    if after is not None:
        if _INTEGER.fullmatch(after) is None:
            raise RouterError(400, "`starting_after` must be an integer", param="starting_after")
        kept["starting_after"] = after
    return "?" + urlencode(kept) if kept else ""


def _needs_usage(body: dict[str, Any], stream: bool) -> bool:
    """A stream whose client did not ask for usage: the router asks and strips it."""
    if not stream:
        return False
    options = body.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


async def _until_disconnect(receive: Receive, work: Awaitable[None]) -> bool:
    """Run `work`, cancelled (its pod connection closed) if the client disconnects first (one
    watcher task per request); whether it did."""
    this = asyncio.current_task()
    assert this is not None
    cancelling = this.cancelling()
    disconnected = asyncio.Event()
    watcher = asyncio.create_task(_cancel_on_disconnect(receive, this, disconnected))
    try:
        await work
    except asyncio.CancelledError:
        # the disconnect's own cancellation is taken back; anyone else's (a drain, a shutdown
        # landing at the same time) goes on
        if not disconnected.is_set() or this.uncancel() > cancelling:
            raise
        return True
    finally:
        watcher.cancel()
    return False


async def _cancel_on_disconnect(
    receive: Receive, task: asyncio.Task[Any], disconnected: asyncio.Event
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            task.cancel()
            return


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None


async def _json(
    send: Send, status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _raw(send, status, json.dumps(obj).encode(), _JSON + (extra or []))


async def _raw(send: Send, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
