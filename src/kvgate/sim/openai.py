"""OpenAI-compatible request parsing and response bodies, shaped like vLLM 0.33's.

Parsing is strict about the fields the simulator uses (types, ranges) and ignores every other
field, as vLLM does. Bad requests raise :class:`BadRequest`, rendered with vLLM's error shape
``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvgate.prefix import PromptError
from kvgate.prefix.cache_ops import (
    CacheOpsError,
    OpHistory,
    parse_cache_ops,
    token_prompt_history,
)
from kvgate.sim.text import TextCodec

DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM and OpenAI default for /v1/completions


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type


def error_body(message: str, status: int = 400, err_type: str = "BadRequestError") -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    ).encode()


@dataclass
class ParsedRequest:
    chat: bool
    model: str
    prompt_token_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cache_salt: str | None
    history: OpHistory | None = None  # AKV cache ops (--sim-akv only)


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}")
    return value


def _bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {value!r}")
    return value


def _op_history(
    body: dict[str, Any], chat: bool, tokens: list[int], codec: TextCodec
) -> OpHistory | None:
    """The `cache` field in token terms: message (or `cache.segments`) ends, then the ops."""
    raw = body.get("cache")
    if raw is None:
        return None
    try:
        if chat:
            if isinstance(raw, dict) and "segments" in raw:
                raise CacheOpsError("`cache.segments` is for /v1/completions only")
            ops = parse_cache_ops(raw, len(body["messages"]))
            if ops is None:
                return None
            ends = codec.message_ends(body, tokens, ops.needed_ends())
            return OpHistory.from_ops(ops, ends)
        return token_prompt_history(raw, len(tokens))
    except (CacheOpsError, PromptError) as exc:
        raise BadRequest(str(exc)) from None


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as vLLM reads it: a JSON object whose `model`, if any, is a string."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise BadRequest("'model' must be a string")
    return body


def parse_request(
    raw: bytes, chat: bool, codec: TextCodec, *, cache_ops: bool = False
) -> ParsedRequest:
    """``cache_ops`` (``--sim-akv``): honour the ``cache`` field; otherwise it is ignored."""
    body = json_object(raw)
    model = body.get("model")
    try:
        if chat:
            tokens = codec.chat_token_ids(body)
        else:
            prompts = codec.completion_token_ids(body)
            if len(prompts) != 1:
                raise BadRequest("the simulator serves one prompt per request")
            tokens = prompts[0]
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc
    if chat:
        max_tokens = _int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens")
    else:
        max_tokens = _int_field(body, "max_tokens")
        if max_tokens is None:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise BadRequest("the simulator supports n=1 only")
    stream = _bool_field(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    if options and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    history = _op_history(body, chat, tokens, codec) if cache_ops else None
    return ParsedRequest(
        chat=chat,
        model=model or "",
        prompt_token_ids=tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=_bool_field(options, "include_usage"),
        continuous_usage=_bool_field(options, "continuous_usage_stats"),
        cache_salt=salt,
        history=history,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def completion_body(
    request_id: str, created: int, model: str, text: str, finish: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "usage": usage_,
    }


def chat_body(
    request_id: str, created: int, model: str, text: str, finish: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        ],
        "usage": usage_,
    }


def stream_chunk(
    chat: bool,
    request_id: str,
    created: int,
    model: str,
    text: str | None,
    finish: str | None,
    first: bool = False,
    usage_: dict[str, Any] | None = None,
) -> bytes:
    """One SSE event (``data: {...}\\n\\n``); ``text=None`` makes a usage-only chunk."""
    choices: list[dict[str, Any]] = []
    if text is not None:
        if chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": text} if first else {"content": text}
            )
            choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish})
        else:
            choices.append(
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            )
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
