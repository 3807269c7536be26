"""OpenAI's Responses API as vLLM 0.33 serves it (`POST /v1/responses`), for the simulated pod.

The input becomes chat messages as vLLM converts it (`construct_input_messages`): the
`instructions` as a system message, then a stored previous response's messages (its input
without the system message, and its output as an assistant message), then the `input` (a string
is a user message; items: messages, function calls folded into an assistant message's
`tool_calls`, function call outputs as tool messages). The answer's id is the request's
`request_id` (vLLM's default `resp_` + a random id). The pod stores each answer in memory, as
vLLM does with `VLLM_ENABLE_RESPONSES_API_STORE=1`, keeping the newest `MAX_STORED` of them (at
most `MAX_STORED_BYTES`; vLLM keeps every one):
only this pod can serve a follow-up (`previous_response_id`) or a retrieval.

A stream opens with `response.created` and `response.in_progress` at once, before the prefill,
then the output item's events with the first token, and ends with `response.completed` carrying
the usage (`input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`), or, when it
reached `max_output_tokens`, with `response.incomplete` (status `incomplete`, as vLLM reports a
finish by length).
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kvgate.sim.openai import BadRequest, json_object

MAX_STORED = 4096
MAX_STORED_BYTES = 64 * 1024 * 1024


@dataclass
class StoredResponse:
    messages: list[dict[str, Any]]  # the conversation, the answer included
    body: dict[str, Any]  # the response object, as retrieved


class ResponseStore:
    """The pod's stored responses: the newest `max_entries`, at most `max_bytes` of JSON."""

    def __init__(self, max_entries: int = MAX_STORED, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        found = self._items.get(response_id)
        return found[0] if found is not None else None

    def put(self, response_id: str, stored: StoredResponse) -> None:
        size = len(json.dumps(stored.messages)) + len(json.dumps(stored.body))
        old = self._items.pop(response_id, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[response_id] = (stored, size)
        self.bytes += size
        # The newest stays, whatever its size: a follow-up may name it next.
        while len(self._items) > 1 and (
            len(self._items) > self.max_entries or self.bytes > self.max_bytes
        ):
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped


@dataclass
class ResponsesRequest:
    response_id: str
    model: str
    messages: list[dict[str, Any]]
    max_output_tokens: int | None
    stream: bool
    store: bool
    cache_salt: str | None
    instructions: str | None
    previous_response_id: str | None


def parse_responses(raw: bytes, store: ResponseStore) -> ResponsesRequest:
    """BadRequest (400, or 404 for an unknown `previous_response_id`) for what vLLM refuses."""
    body = json_object(raw)
    model = body.get("model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string")
    response_id = body.get("request_id")
    if response_id is None:
        response_id = f"resp_{uuid.uuid4().hex}"
    if not isinstance(response_id, str):
        raise BadRequest("'request_id' must be a string")
    previous_id = body.get("previous_response_id")
    previous: list[dict[str, Any]] = []
    if previous_id is not None:
        stored = store.get(previous_id) if isinstance(previous_id, str) else None
        if stored is None:
            raise BadRequest(
                f"Response with id '{previous_id}' not found.", 404, "invalid_request_error"
            )  # vLLM names param `response_id`
        previous = [m for m in stored.messages if m.get("role") != "system"]
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(previous)
    messages.extend(_input_messages(body.get("input")))
    max_output = body.get("max_output_tokens")
    if max_output is not None and (isinstance(max_output, bool) or not isinstance(max_output, int)):
        raise BadRequest("'max_output_tokens' must be an integer")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    return ResponsesRequest(
        response_id=response_id,
        model=model or "",
        messages=messages,
        max_output_tokens=max_output,
        stream=body.get("stream") is True,
        store=body.get("store", True) is not False,
        cache_salt=salt,
        instructions=instructions,
        previous_response_id=previous_id,
    )


def _input_messages(items: Any) -> list[dict[str, Any]]:
    """vLLM's `construct_chat_messages_with_tool_call`: a tool call, reasoning or an assistant
    message's text joins the assistant message before it where that has none yet."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("'input' must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object")
        kind = item.get("type")
        last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        if kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments")
            if kind == "custom_tool_call":
                arguments = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": arguments}}  # fmt: skip
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or [{}]
            reasoning = parts[0].get("text", "") if isinstance(parts[0], dict) else ""
            if last is not None and "reasoning" not in last:
                last["reasoning"] = reasoning
            else:
                messages.append({"role": "assistant", "reasoning": reasoning})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
            )
        elif item.get("role") == "assistant":
            text = _first_text(item.get("content"))
            if last is not None and last.get("content") is None:
                last["content"] = text
            else:
                messages.append({"role": "assistant", "content": text})
        elif "role" in item:
            messages.append({"role": item["role"], "content": _parts(item.get("content"))})
        else:
            raise BadRequest(f"Unsupported input item type: {kind}")
    return messages


def _first_text(content: Any) -> str:
    """An assistant item's text: vLLM keeps its first part only."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return str(content[0].get("text", ""))
    return ""


def _parts(content: Any) -> Any:
    """A message item's content as chat content: a string, or its text parts."""
    if not isinstance(content, list):
        return content if isinstance(content, str) else ""
    return [
        {"type": "text", "text": part.get("text", "")}
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]


def response_object(
    req: ResponsesRequest,
    created: int,
    model: str,
    text: str | None,
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The response object; `text` None: no output yet. `status` "incomplete": the answer
    reached `max_output_tokens` (vLLM's finish reason `length`)."""
    output: list[dict[str, Any]] = []
    if text is not None:
        item_status = "incomplete" if status == "incomplete" else "completed"
        output.append(_message_item(req, text, item_status))
    details = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": req.response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "instructions": req.instructions,
        "output": output,
        "previous_response_id": req.previous_response_id,
        "max_output_tokens": req.max_output_tokens,
        "status": status,
        "incomplete_details": details,
        "usage": usage,
    }


def _message_item(req: ResponsesRequest, text: str, status: str) -> dict[str, Any]:
    return {
        "id": f"msg_{req.response_id}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def responses_usage(prompt_tokens: int, output_tokens: int, cached: int | None) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached or 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


class EventWriter:
    """A Responses stream's events, numbered in order."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.req = req
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def opening(self, response: dict[str, Any]) -> bytes:
        return self.event("response.created", response=response) + self.event(
            "response.in_progress", response=response
        )

    def output_started(self) -> bytes:
        item = _message_item(self.req, "", "in_progress")
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": []}
        return self.event("response.output_item.added", output_index=0, item=item) + self.event(
            "response.content_part.added",
            item_id=item["id"],
            output_index=0,
            content_index=0,
            part=part,
        )

    def delta(self, text: str) -> bytes:
        return self.event(
            "response.output_text.delta",
            item_id=f"msg_{self.req.response_id}",
            output_index=0,
            content_index=0,
            delta=text,
        )

    def closing(self, text: str, response: dict[str, Any]) -> bytes:
        """The output's end events and the terminal one, `response.completed` or
        `response.incomplete` as the response's status says."""
        incomplete = response["status"] == "incomplete"
        item = _message_item(self.req, text, "incomplete" if incomplete else "completed")
        item_id = item["id"]
        part = item["content"][0]
        return b"".join(
            (
                self.event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    text=text,
                ),
                self.event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                ),
                self.event("response.output_item.done", output_index=0, item=item),
                self.event(f"response.{response['status']}", response=response),
            )
        )
