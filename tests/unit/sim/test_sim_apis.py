"""The simulated pod's Responses and Anthropic Messages APIs: request bodies read into chat
messages as vLLM 0.33 converts them, and the bounded response store."""

from __future__ import annotations

import json

import pytest

from kvgate.sim.messages import parse_messages, usage
from kvgate.sim.openai import BadRequest
from kvgate.sim.responses import ResponseStore, StoredResponse, parse_responses


def _responses(body: dict, store: ResponseStore | None = None) -> list[dict]:
    return parse_responses(
        json.dumps({"model": "m", **body}).encode(), store or ResponseStore()
    ).messages


def test_responses_items_fold_into_chat_messages_as_vllm_folds_them():
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x.py"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"},
                                                             {"type": "output_text", "text": "!"}]},
    ]  # fmt: skip
    messages = _responses({"instructions": "sys", "input": items})
    assert messages[0] == {"role": "system", "content": "sys"}
    assert messages[1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assistant = messages[2]
    assert assistant["reasoning"] == "hm" and [c["id"] for c in assistant["tool_calls"]] == [
        "c1",
        "c2",
    ]
    assert messages[3] == {"role": "tool", "content": "x.py", "tool_call_id": "c1"}
    assert messages[4] == {"role": "assistant", "content": "ok"}  # the first part only
    with pytest.raises(BadRequest, match="Unsupported input item type"):
        _responses({"input": [{"type": "web_search_call"}]})


def test_a_follow_up_reads_the_stored_conversation_without_its_system_message():
    store = ResponseStore()
    store.put("resp_1", StoredResponse(
        [{"role": "system", "content": "old"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "a"}], {"id": "resp_1"}))  # fmt: skip
    messages = _responses({"instructions": "new", "input": "q2", "previous_response_id": "resp_1"},
                          store)  # fmt: skip
    assert [m["content"] for m in messages] == ["new", "q", "a", "q2"]
    with pytest.raises(BadRequest) as err:
        _responses({"input": "x", "previous_response_id": "resp_2"}, store)
    assert err.value.status == 404


def test_the_store_keeps_the_newest_within_its_bounds():
    store = ResponseStore(max_entries=3, max_bytes=2_000)
    for i in range(5):
        store.put(f"r{i}", StoredResponse([{"role": "user", "content": "x" * 100}], {"id": i}))
    assert [store.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
    store.put("big", StoredResponse([{"role": "user", "content": "y" * 5_000}], {}))
    assert store.get("big") is not None and store.get("r4") is None  # the newest stays
    store.put("big", StoredResponse([], {}))  # stored again: counted once
    assert store.bytes < 100


def test_anthropic_messages_become_vllms_chat_messages():
    body = {
        "model": "m", "max_tokens": 8,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
                   {"type": "text", "text": "You are "}, {"type": "text", "text": "Claude."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"},
                                         {"type": "text", "text": ""},
                                         {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "let me see", "signature": "s"},
                {"type": "text", "text": "reading"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "é.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1",
                 "content": [{"type": "text", "text": "l1"}, {"type": "text", "text": "l2"}]}]},
        ],
    }  # fmt: skip
    messages = parse_messages(json.dumps(body).encode()).messages
    assert messages[0] == {"role": "system", "content": "You are Claude."}
    assert messages[1]["content"] == [
        {"type": "text", "text": "one"},
        {"type": "text", "text": "two"},
    ]
    assistant = messages[2]
    assert assistant["content"] == "reading" and assistant["reasoning"] == "let me see"
    assert assistant["tool_calls"][0]["function"]["arguments"] == json.dumps({"path": "é.py"})
    # A user turn of tool results alone is its tool messages.
    assert messages[3:] == [{"role": "tool", "tool_call_id": "t1", "content": "l1\nl2"}]


def test_anthropic_usage_splits_the_prompt_only_with_prompt_token_details():
    assert usage(100, 5, None) == {"input_tokens": 100, "output_tokens": 5}
    assert usage(100, 5, 48, 32) == {"input_tokens": 20, "output_tokens": 5,
                                     "cache_read_input_tokens": 48,
                                     "cache_creation_input_tokens": 32}  # fmt: skip
