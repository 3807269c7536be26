"""Anthropic's Messages API as vLLM 0.33 serves it (`POST /v1/messages`), for the simulated pod.

vLLM turns the request into a chat request: the top-level `system` (a string, or text blocks
without Claude Code's per-request `x-anthropic-billing-header` block) becomes a system message,
each message's text blocks its content, an assistant's `tool_use` blocks its tool calls, a
user's `tool_result` blocks tool messages. The answer is Anthropic-shaped; with
`--enable-prompt-tokens-details`, `usage.cache_read_input_tokens` counts the prompt tokens read
from the cache, `cache_creation_input_tokens` those written to it (its full blocks not read) and
`input_tokens` the rest. A stream's headers go out at once; `message_start` comes with the first
token (vLLM converts its chat stream, which opens then), the text as `content_block_delta`
events, then `message_delta` (stop reason, usage) and `message_stop`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kvgate.prefix.approx import BILLING_HEADER
from kvgate.sim.openai import BadRequest, json_object


@dataclass
class MessagesRequest:
    message_id: str
    model: str
    messages: list[dict[str, Any]]  # as chat messages
    max_tokens: int
    stream: bool
    cache_salt: str | None


def parse_messages(raw: bytes, *, counting: bool = False) -> MessagesRequest:
    """BadRequest for what vLLM refuses. `counting`: a token count's body (no `max_tokens`)."""
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("Model is required")
    max_tokens = 1 if counting else body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadRequest("'messages' must be a non-empty list")
    messages = _system(body.get("system"))
    for message in raw_messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        messages.extend(_chat_messages(message))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    return MessagesRequest(
        message_id=f"msg_{uuid.uuid4().hex}",
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        stream=body.get("stream") is True,
        cache_salt=salt,
    )


def _system(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list):
        texts = [
            block["text"]
            for block in system
            if isinstance(block, dict)
            and isinstance(block.get("text"), str)
            and block["text"]
            and not block["text"].startswith(BILLING_HEADER)
        ]
        return [{"role": "system", "content": "".join(texts)}] if texts else []
    return []


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages, as vLLM's `_convert_messages` makes them: a
    user's tool results become tool messages before it; text blocks its content (one: a string,
    more: text parts), `tool_use` blocks its tool calls, `thinking` its reasoning."""
    role, content = message.get("role"), message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest("'content' must be a string or a list of blocks")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name") or "", "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result":
            result = block.get("content")
            if role != "user":
                parts.append({"type": "text", "text": f"Tool result: {result or ''}"})
                continue
            text = result if isinstance(result, str) else _texts(result)
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
                        "content": text})  # fmt: skip
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind not in ("redacted_thinking", "image", "tool_reference"):
            raise BadRequest(f"Unsupported content block type: {kind}")
    chat: dict[str, Any] = {"role": role}
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 else parts
    if parts or calls or reasoning or role != "user":
        out.append(chat)
    return out


def _texts(blocks: Any) -> str:
    """A tool result's text blocks, one per line."""
    if not isinstance(blocks, list):
        return ""
    return "\n".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


def usage(
    prompt_tokens: int, output_tokens: int, cached: int | None, created: int = 0
) -> dict[str, Any]:
    """vLLM's `_build_anthropic_usage`: with prompt-token details (`cached` not None),
    `input_tokens` are the prompt tokens neither read from the cache nor written to it now."""
    if cached is None:
        return {"input_tokens": prompt_tokens, "output_tokens": output_tokens}
    return {
        "input_tokens": max(0, prompt_tokens - cached - created),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": created,
    }


def message_body(
    req: MessagesRequest, text: str, stop_reason: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": req.message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": req.model,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_,
    }


def event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def opening(req: MessagesRequest, prompt_tokens: int) -> bytes:
    """`message_start` (the prompt's size, no cache split yet) and the text block's start, sent
    with the first token."""
    message = {**message_body(req, "", "", usage(prompt_tokens, 0, None)), "content": []}
    message["stop_reason"] = None
    return event("message_start", message=message) + event(
        "content_block_start", index=0, content_block={"type": "text", "text": ""}
    )


def delta(text: str) -> bytes:
    return event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})


def closing(stop_reason: str, usage_: dict[str, Any]) -> bytes:
    stop = {"stop_reason": stop_reason, "stop_sequence": None}
    return b"".join(
        (
            event("content_block_stop", index=0),
            event("message_delta", delta=stop, usage=usage_),
            event("message_stop"),
        )
    )


def error_body(message: str, status: int) -> bytes:
    """vLLM's Anthropic-shaped error."""
    kind = {404: "not_found_error"}.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
