"""The simulated pod's HTTP API: a raw ASGI app (no framework on the hot path).

Routes (as vLLM 0.33 serves them): ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/responses`` (streaming SSE or not; ``sim/responses.py``), ``GET /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, ``POST /v1/messages`` and ``/v1/messages/count_tokens``
(Anthropic's; ``sim/messages.py``), ``POST /v1/embeddings``, ``/tokenize``, ``/detokenize``
(``sim/embeddings.py``), ``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /version``,
``POST /reset_prefix_cache``, ``GET /server_info`` and ``GET /model_info`` (plus the
``/get_server_info`` and ``/get_model_info`` spellings the SGLang router asks for).
Simulator-only: ``POST /sim/restart`` restarts the engine (KV event seq back to 0).

Non-streaming responses carry ``x-sim-arrival-seconds`` and ``x-sim-ttft-seconds``: the virtual
arrival time and TTFT of the request, to compare with the discrete-event mode.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvgate.sim import embeddings
from kvgate.sim import messages as anthropic
from kvgate.sim.driver import RequestStream
from kvgate.sim.engine import RequestRejected
from kvgate.sim.openai import (
    BadRequest,
    ParsedRequest,
    chat_body,
    completion_body,
    error_body,
    parse_request,
    stream_chunk,
    usage,
)
from kvgate.sim.pod import SimPod
from kvgate.sim.responses import (
    EventWriter,
    ResponsesRequest,
    ResponseStore,
    StoredResponse,
    parse_responses,
    response_object,
    responses_usage,
)
from kvgate.tasks import cancel_and_wait

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

VLLM_VERSION = "0.33.0"
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_STORED = "/v1/responses/"


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    all_headers = [*(headers or _JSON), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client disconnected")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class SimApp:
    """ASGI application serving one :class:`SimPod`."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod
        self.model = pod.config.served_model_name
        self._names = set(pod.config.served_model_names or [pod.config.model])
        lora = pod.config.engine.lora
        self._adapters = {m.name: m for m in lora.modules} if lora is not None else {}
        self.responses = ResponseStore()
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/version"): self._version,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/responses"): self._responses,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._tokenize,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._model_info,
            ("POST", "/sim/restart"): self._restart,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        if handler is None and scope["path"].startswith(_STORED):
            handler = self._stored_response
        if handler is None:
            known = any(path == scope["path"] for _m, path in self._routes)
            status = 405 if known else 404
            phrase = "Method Not Allowed" if known else "Not Found"
            await _respond(send, status, json.dumps({"detail": phrase}).encode())
            return
        await handler(scope, receive, send)

    async def _accepted(
        self,
        receive: Receive,
        send: Send,
        prepare: Callable[[bytes], T],
        *,
        anthropic_errors: bool = False,
    ) -> T | None:
        """The request body read and `prepare`d (parsed, submitted); None once answered: the
        client left, or the request is refused (vLLM's 400/404, in Anthropic's shape on its
        routes)."""
        try:
            raw = await _read_body(receive)
        except ConnectionError:
            return None
        try:
            return prepare(raw)
        except BadRequest as exc:
            status, message, err_type = exc.status, exc.message, exc.err_type
        except (RequestRejected, TypeError, ValueError) as exc:
            status, message, err_type = 400, str(exc), "BadRequestError"
        if anthropic_errors:
            await _respond(send, status, anthropic.error_body(message, status))
        else:
            await _respond(send, status, error_body(message, status, err_type))
        return None

    def _served(self, model: str) -> None:
        """BadRequest (vLLM's 404) unless `model` is empty (the pod's own) or one it serves."""
        if model and model not in self._names:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.pod.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.pod.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- small endpoints -------------------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, b"")

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, json.dumps({"version": VLLM_VERSION}).encode())

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = generate_latest(self.pod.metrics.registry)
        await _respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        cards: list[dict[str, Any]] = [
            {
                "id": name,
                "object": "model",
                "created": self.pod.created,
                "owned_by": "vllm",
                "root": self.pod.config.model,
                "parent": None,
                "max_model_len": self.pod.config.engine.max_model_len,
                "permission": [],
            }
            for name in sorted(self._names)
        ]
        cards += [
            {
                "id": module.name,
                "object": "model",
                "created": self.pod.created,
                "owned_by": "vllm",
                "root": module.path,
                "parent": self.model,
                "max_model_len": self.pod.config.engine.max_model_len,
                "permission": [],
            }
            for module in self._adapters.values()
        ]
        await _respond(send, 200, json.dumps({"object": "list", "data": cards}).encode())

    async def _reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok = self.pod.engine.reset_prefix_cache()
        await _respond(send, 200, json.dumps({"success": ok}).encode())

    async def _restart(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.pod.restart()
        self.responses = ResponseStore()  # vLLM keeps them in the process's memory
        await _respond(send, 200, json.dumps({"restarted": True}).encode())

    def _model_info_dict(self) -> dict[str, Any]:
        return {
            "model_path": self.pod.config.model,
            "tokenizer_path": self.pod.config.tokenizer or self.pod.config.model,
            "is_generation": True,
            "served_model_name": self.model,
            "max_model_len": self.pod.config.engine.max_model_len,
        }

    async def _model_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, json.dumps(self._model_info_dict()).encode())

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        cfg = self.pod.config
        info = {
            "vllm_config": {
                "model_config": self._model_info_dict(),
                "cache_config": self.pod.cache_info(),
                "scheduler_config": {
                    "max_num_seqs": cfg.engine.max_num_seqs,
                    "max_num_batched_tokens": cfg.engine.max_num_batched_tokens,
                },
                "simulator": {
                    "profile": self.pod.profile.name,
                    "time_scale": cfg.time_scale,
                    "cache_ops": cfg.akv,
                },
            },
            "vllm_env": {},
            "system_env": {},
            "version": VLLM_VERSION,
            "model_path": cfg.model,
            "served_model_name": self.model,
            "max_total_num_tokens": (self.pod.engine.num_gpu_blocks - 1) * cfg.engine.block_size,
        }
        await _respond(send, 200, json.dumps(info).encode())

    # -- generation ------------------------------------------------------------------------

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(receive, send, chat=False)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(receive, send, chat=True)

    async def _generate(self, receive: Receive, send: Send, chat: bool) -> None:
        def prepare(raw: bytes) -> tuple[ParsedRequest, str, RequestStream]:
            req = parse_request(raw, chat, self.pod.codec, cache_ops=self.pod.config.akv)
            adapter = self._adapters.get(req.model)
            if adapter is None:
                self._served(req.model)
            max_tokens = req.max_tokens
            if max_tokens is None:  # chat without a limit: stop where vLLM would hit EOS
                used = len(req.prompt_token_ids)
                if req.history is not None:  # repositions renumber what is left
                    used = req.history.positions(used)
                room = self.pod.config.engine.max_model_len - used
                max_tokens = max(1, min(self.pod.config.chat_output_tokens, room))
            request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
            stream = self.pod.driver.submit(
                request_id,
                req.prompt_token_ids,
                max_tokens,
                cache_salt=req.cache_salt,
                lora=adapter,
                history=req.history,
            )
            return req, request_id, stream

        accepted = await self._accepted(receive, send, prepare)
        if accepted is None:
            return
        req, request_id, stream = accepted
        watcher = asyncio.create_task(self._watch_disconnect(receive, stream))
        try:
            if req.stream:
                await self._stream(send, req, request_id, stream)
            else:
                await self._complete(send, req, request_id, stream)
        finally:
            await cancel_and_wait(watcher)

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        def prepare(raw: bytes) -> tuple[ResponsesRequest, RequestStream]:
            req = parse_responses(raw, self.responses)
            self._served(req.model)
            prompt = self.pod.codec.chat_token_ids({"messages": req.messages})
            max_tokens = req.max_output_tokens
            if max_tokens is None:
                room = self.pod.config.engine.max_model_len - len(prompt)
                max_tokens = max(1, min(self.pod.config.chat_output_tokens, room))
            stream = self.pod.driver.submit(
                req.response_id, prompt, max_tokens, cache_salt=req.cache_salt
            )
            return req, stream

        accepted = await self._accepted(receive, send, prepare)
        if accepted is None:
            return
        req, stream = accepted
        watcher = asyncio.create_task(self._watch_disconnect(receive, stream))
        try:
            await self._answer_responses(send, req, stream)
        finally:
            await cancel_and_wait(watcher)

    async def _answer_responses(
        self, send: Send, req: ResponsesRequest, stream: RequestStream
    ) -> None:
        model = req.model or self.model
        created = self.pod.created
        events = EventWriter(req)
        if req.stream:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            opening = response_object(req, created, model, None, "in_progress", None)
            await send({"type": "http.response.body", "body": events.opening(opening),
                        "more_body": True})  # fmt: skip
        sent = 0
        while True:
            await stream.wait(sent)
            new = stream.tokens[sent:]
            if req.stream and new:
                out = events.output_started() if sent == 0 else b""
                out += events.delta(self.pod.codec.decode(new))
                await send({"type": "http.response.body", "body": out, "more_body": True})
            sent += len(new)
            if stream.done:
                break
        if not stream.request.is_finished or stream.request.finish_time is None:
            if req.stream:
                await send({"type": "http.response.body", "body": b""})
            else:
                await _respond(
                    send, 500, error_body("engine restarted", 500, "InternalServerError")
                )
            return
        text = self.pod.codec.decode(stream.tokens)
        sim = stream.request
        cached = max(sim.num_cached_tokens, 0)
        limited = req.max_output_tokens is not None and len(stream.tokens) >= sim.max_tokens
        answer = response_object(
            req, created, model, text, "incomplete" if limited else "completed",
            responses_usage(sim.num_prompt_tokens, len(stream.tokens), cached),
        )  # fmt: skip
        if req.store:
            conversation = [*req.messages, {"role": "assistant", "content": text}]
            self.responses.put(req.response_id, StoredResponse(conversation, answer))
        if req.stream:
            await send({"type": "http.response.body", "body": events.closing(text, answer)})
        else:
            await _respond(send, 200, json.dumps(answer).encode())

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        def prepare(raw: bytes) -> tuple[anthropic.MessagesRequest, RequestStream]:
            req = anthropic.parse_messages(raw)
            self._served(req.model)
            prompt = self.pod.codec.chat_token_ids({"messages": req.messages})
            stream = self.pod.driver.submit(
                req.message_id, prompt, req.max_tokens, cache_salt=req.cache_salt
            )
            return req, stream

        accepted = await self._accepted(receive, send, prepare, anthropic_errors=True)
        if accepted is None:
            return
        req, stream = accepted
        watcher = asyncio.create_task(self._watch_disconnect(receive, stream))
        try:
            await self._answer_messages(send, req, stream)
        finally:
            await cancel_and_wait(watcher)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        def count(raw: bytes) -> int:
            req = anthropic.parse_messages(raw, counting=True)
            return len(self.pod.codec.chat_token_ids({"messages": req.messages}))

        tokens = await self._accepted(receive, send, count, anthropic_errors=True)
        if tokens is not None:
            await _respond(send, 200, json.dumps({"input_tokens": tokens}).encode())

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Each input is prefilled by the engine (one token asked), then answered together."""

        def prepare(raw: bytes) -> tuple[str, list[list[int]], list[RequestStream]]:
            model, prompts = embeddings.embedding_inputs(raw, self.pod.codec)
            self._served(model)
            submit = self.pod.driver.submit
            return model, prompts, [submit(f"embd-{uuid.uuid4().hex}", p, 1) for p in prompts]

        accepted = await self._accepted(receive, send, prepare)
        if accepted is None:
            return
        model, prompts, streams = accepted
        for stream in streams:
            while not stream.done:
                await stream.wait(len(stream.tokens))
        body = embeddings.embeddings_body(model or self.model, prompts, self.pod.created)
        await _respond(send, 200, json.dumps(body).encode())

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        codec, limit = self.pod.codec, self.pod.config.engine.max_model_len

        def answer(raw: bytes) -> dict[str, Any]:
            if scope["path"] == "/tokenize":
                return embeddings.tokenize(raw, codec, limit)
            return embeddings.detokenize(raw, codec)

        answered = await self._accepted(receive, send, answer)
        if answered is not None:
            await _respond(send, 200, json.dumps(answered).encode())

    async def _answer_messages(
        self, send: Send, req: anthropic.MessagesRequest, stream: RequestStream
    ) -> None:
        sim = stream.request
        if req.stream:  # Starlette's StreamingResponse: the head before the first event
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        sent = 0
        while True:
            await stream.wait(sent)
            new = stream.tokens[sent:]
            if req.stream and new:
                opening = anthropic.opening(req, sim.num_prompt_tokens) if sent == 0 else b""
                out = opening + anthropic.delta(self.pod.codec.decode(new))
                await send({"type": "http.response.body", "body": out, "more_body": True})
            sent += len(new)
            if stream.done:
                break
        if not sim.is_finished or sim.finish_time is None:
            if req.stream:
                error = {"type": "api_error", "message": "engine restarted"}
                failed = anthropic.event("error", error=error)
                await send({"type": "http.response.body", "body": failed})
            else:
                await _respond(send, 500, anthropic.error_body("engine restarted", 500))
            return
        text = self.pod.codec.decode(stream.tokens)
        stop = "max_tokens" if len(stream.tokens) >= sim.max_tokens else "end_turn"
        cached = None
        created = 0
        if self.pod.config.enable_prompt_tokens_details:
            cached = max(sim.num_cached_tokens, 0)
            block = self.pod.config.engine.block_size
            created = max(0, sim.num_prompt_tokens // block * block - cached)
        usage_ = anthropic.usage(sim.num_prompt_tokens, len(stream.tokens), cached, created)
        if req.stream:
            await send({"type": "http.response.body", "body": anthropic.closing(stop, usage_)})
        else:
            body = anthropic.message_body(req, text, stop, usage_)
            await _respond(send, 200, json.dumps(body).encode())

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (a stored answer is
        complete: cancelling it is vLLM's 400)."""
        response_id, _, action = scope["path"][len(_STORED) :].partition("/")
        stored = self.responses.get(response_id)
        if action not in ("", "cancel") or scope["method"] != ("GET" if not action else "POST"):
            await _respond(send, 404, json.dumps({"detail": "Not Found"}).encode())
        elif stored is None:
            message = f"Response with id '{response_id}' not found."
            await _respond(send, 404, error_body(message, 404, "invalid_request_error"))
        elif action == "cancel":
            message = "Cannot cancel a synchronous response."
            await _respond(send, 400, error_body(message, 400, "invalid_request_error"))
        else:
            await _respond(send, 200, json.dumps(stored.body).encode())

    async def _watch_disconnect(self, receive: Receive, stream: RequestStream) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.pod.driver.abort(stream)
                return

    def _usage(self, req: ParsedRequest, stream: RequestStream) -> dict[str, Any]:
        sim = stream.request
        cached = None
        if self.pod.config.enable_prompt_tokens_details:
            cached = max(sim.num_cached_tokens, 0)
        return usage(sim.num_prompt_tokens, len(stream.tokens), cached)

    def _finish_reason(self, req: ParsedRequest, stream: RequestStream) -> str:
        if req.max_tokens is None:
            return "stop"  # a chat answer without a limit ends where vLLM would meet EOS
        return "length" if len(stream.tokens) >= stream.request.max_tokens else "stop"

    async def _complete(
        self, send: Send, req: ParsedRequest, request_id: str, stream: RequestStream
    ) -> None:
        while not stream.done:
            await stream.wait(len(stream.tokens))
        if not stream.request.is_finished or stream.request.finish_time is None:
            await _respond(send, 500, error_body("engine restarted", 500, "InternalServerError"))
            return
        text = self.pod.codec.decode(stream.tokens)
        build = chat_body if req.chat else completion_body
        body = build(
            request_id,
            self.pod.created,
            req.model or self.model,
            text,
            self._finish_reason(req, stream),
            self._usage(req, stream),
        )
        sim = stream.request
        ttft = (sim.first_token_time or 0.0) - sim.arrival_time
        headers = [
            *_JSON,
            (b"x-sim-arrival-seconds", repr(sim.arrival_time).encode()),
            (b"x-sim-ttft-seconds", repr(ttft).encode()),
        ]
        await _respond(send, 200, json.dumps(body).encode(), headers)

    async def _stream(
        self, send: Send, req: ParsedRequest, request_id: str, stream: RequestStream
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        model = req.model or self.model
        created = self.pod.created
        sent = 0
        first = not req.chat
        opening = req.chat
        while True:
            await stream.wait(sent)
            if opening:
                # vLLM opens a chat stream with the assistant role and empty content when the
                # engine's first output arrives (with the first token), not before prefill.
                opening = False
                role = stream_chunk(True, request_id, created, model, "", None, first=True)
                await send({"type": "http.response.body", "body": role, "more_body": True})
            new = stream.tokens[sent:]
            sent += len(new)
            if new or (stream.done and sent == 0):
                finish = self._finish_reason(req, stream) if stream.done else None
                if not new:
                    finish = "abort"
                # vLLM's continuous usage carries no prompt_tokens_details (the last chunk's does)
                chunk_usage = (
                    usage(stream.request.num_prompt_tokens, len(stream.tokens), None)
                    if req.continuous_usage
                    else None
                )
                chunk = stream_chunk(
                    req.chat,
                    request_id,
                    created,
                    model,
                    self.pod.codec.decode(new),
                    finish,
                    first=first,
                    usage_=chunk_usage,
                )
                first = False
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if stream.done:
                break
        tail = b""
        if req.include_usage:
            tail += stream_chunk(
                req.chat, request_id, created, model, None, None, usage_=self._usage(req, stream)
            )
        tail += b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})
