"""The Responses and Anthropic Messages APIs' parts: response ids naming pods and tenants, the
keyed text, usage, error shapes, the opening events, and the proxy holding a stream's opening
events back until its first output (retried before)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import zipfile
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from tests.unit.router.fakes import make_config
from tests.vllm_wheel import vllm_wheel

from kvgate.discovery.endpoints import Endpoint, EndpointSpec
from kvgate.prefix.approx import request_text, responses_text
from kvgate.promtext import sum_samples
from kvgate.router.core.classify import Classifier
from kvgate.router.core.errors import RouterError, anthropic_error_body
from kvgate.router.core.response_ids import (
    PREFIX,
    UNSCOPED,
    ResponseId,
    endpoint_tag,
    mint,
    parse,
    scope_tag,
    tagged,
)
from kvgate.router.http.proxy import stream_error
from kvgate.router.http.responses_stream import OpeningEvents, is_opening
from kvgate.router.http.upstream import UpstreamError
from kvgate.router.http.usage import SseUsageTap, usage_from_json_body
from kvgate.router.runtime import RouterRuntime
from kvgate.router.server.app import RouterApp

PREFILL_SECONDS = 0.05


def _event(kind: str, *, line: bool = True, **fields: Any) -> bytes:
    data = json.dumps({**fields, "type": kind})  # vLLM writes the type last
    return (f"event: {kind}\n" if line else "").encode() + f"data: {data}\n\n".encode()


def test_a_minted_id_names_its_pod_and_tenant_and_nothing_else_does():
    pods = [
        Endpoint(EndpointSpec(f"ns/pod-{i}", "ns/p", f"http://10.0.0.{i}:8000")) for i in range(5)
    ]
    scopes = [UNSCOPED, scope_tag("salt-a"), scope_tag("salt-b")]
    assert len(set(scopes)) == 3
    for pod in pods:
        for scope in scopes:
            minted = mint(pod.id, scope)
            assert minted.startswith(PREFIX) and minted != mint(pod.id, scope)  # random part
            assert parse(minted) == ResponseId(endpoint_tag(pod.id), scope)
            assert tagged(pods, endpoint_tag(pod.id)) is pod
    assert tagged(pods[1:], endpoint_tag(pods[0].id)) is None  # the pod left
    good = mint("a", scopes[1])
    for other in (None, 7, "", "resp_" + "0" * 58, good.upper(), good + "0", good[:-1],
                  good[:-1] + "g", good.replace("resp_kg", "resp_kh")):  # fmt: skip
        assert parse(other) is None, other


def test_with_tenants_a_previous_response_of_another_tenant_is_unknown():
    config = make_config(
        2,
        tenants={
            "tenants": [
                {"name": "a", "api_keys": [{"value": "key-a"}]},
                {"name": "b", "api_keys": [{"value": "key-b"}]},
            ]
        },
    )
    classifier = Classifier(config)
    as_a, as_b = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}
    body = {"model": "m", "input": "hi"}
    salt_a = classifier.classify(body, as_a).cache_salt
    scope_a = classifier.response_scope(salt_a)
    assert scope_a != UNSCOPED and scope_a == classifier.caller_scope(as_a)
    assert classifier.caller_scope(as_b) not in (scope_a, UNSCOPED)
    written = mint("pod0:8000", scope_a)
    follow_up = {**body, "previous_response_id": written}
    assert classifier.classify(follow_up, as_a, "responses").pinned_tag == endpoint_tag("pod0:8000")
    assert classifier.classify(follow_up, as_b, "chat").pinned_tag is None  # not chat's field
    with pytest.raises(RouterError) as err:
        classifier.classify(follow_up, as_b, "responses")
    assert err.value.status == 404 and "not found" in err.value.message
    # Without tenants every id is unscoped, and an id that is not a router's pins nothing.
    open_classifier = Classifier(make_config(2))
    assert open_classifier.response_scope("client-salt") == UNSCOPED
    unscoped = {**body, "previous_response_id": mint("pod1:8000")}
    assert open_classifier.classify(unscoped, {}, "responses").pinned_tag == endpoint_tag(
        "pod1:8000"
    )
    foreign = {**body, "previous_response_id": "resp_123"}
    assert open_classifier.classify(foreign, {}, "responses").pinned_tag is None


def test_responses_text_of_a_later_turn_extends_the_earlier_one():
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": "list"}]}]
    base = {"model": "m", "instructions": "be brief", "tools": tools}
    texts = []
    rng = random.Random(0)
    for turn in range(6):
        texts.append(responses_text({**base, "input": list(items)}))
        call = {"type": "function_call", "call_id": f"c{turn}", "name": "ls", "arguments": "{}",
                "id": f"fc_{turn}", "status": "completed"}  # fmt: skip
        output = {
            "type": "function_call_output",
            "call_id": f"c{turn}",
            "output": "x" * rng.randint(1, 400),
        }
        items += [call, output, {"role": "assistant", "content": "ok"}]
    for earlier, later in itertools.pairwise(texts):
        assert later.startswith(earlier) and len(later) > len(earlier)
    assert texts[0].startswith("<|tools|>") and "<|system|>\nbe brief\n" in texts[0]
    assert request_text({**base, "input": list(items)}) == responses_text({**base, "input": items})
    # A string input is a user message; a completion body with `input` stays a completion.
    assert responses_text({"input": "hi"}) == "<|user|>\nhi\n"
    assert request_text({"prompt": "p", "input": "x"}) == "p"


def test_usage_of_responses_answers_and_streams():
    usage = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 96},
             "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 127}  # fmt: skip
    body = {"id": "resp_1", "object": "response", "output": [], "usage": usage, "user": None}
    got = usage_from_json_body(json.dumps(body).encode())
    assert got is not None and (got.prompt_tokens, got.cached_tokens, got.completion_tokens) == (
        120, 96, 7)  # fmt: skip
    tap = SseUsageTap(strip_usage_chunk=False)
    stream = (
        _event("response.created", response={"id": "r", "usage": None})
        + _event("response.output_text.delta", delta='"usage": {"input_tokens": 9}')
        + _event("response.completed", response={"id": "r", "usage": usage})
    )
    assert tap.feed(stream) == stream  # nothing stripped
    assert tap.usage is not None and tap.usage.cached_tokens == 96


def test_opening_events_end_at_the_first_output_however_the_bytes_are_cut():
    rng = random.Random(1)
    for line in (True, False):
        opening = _event("response.created", line=line, response={"instructions": "x" * 300,
                         "tools": [{"type": "function"}]}) + _event(
            "response.in_progress", line=line, response={"status": "in_progress"})  # fmt: skip
        first = _event("response.output_item.added", line=line, item={"type": "message"})
        assert all(is_opening(e + b"\n\n") for e in opening.split(b"\n\n")[:-1])
        assert not is_opening(first)
        for _ in range(50):
            data = opening + first + b"event: more\r\n\r\n"
            reader, fed, done_at = OpeningEvents(1 << 20), 0, None
            while fed < len(data):
                cut = min(len(data), fed + rng.randint(1, 40))
                if reader.feed(data[fed:cut]):
                    done_at = cut
                    break
                fed = cut
            assert done_at is not None and done_at >= len(opening + first)
            assert done_at - len(opening + first) < 40 and reader.held == data[:done_at]
    reader = OpeningEvents(100)
    assert not reader.feed(b"event: response.created\ndata: {}\n\n")
    with pytest.raises(UpstreamError):
        reader.feed(b"x" * 80)


async def test_a_stream_that_fails_before_its_first_output_is_retried_unseen():
    """Each request's first pod opens the stream and dies before any output: the client sees
    the second pod's stream only, whole; the router's TTFT is that of the first output event,
    not of the opening."""
    answered: list[str] = []

    class Opened(httpx.AsyncByteStream):
        def __init__(self, pod: str, dies: bool) -> None:
            self.pod, self.dies = pod, dies

        async def __aiter__(self):
            yield _event("response.created", response={"id": self.pod, "usage": None})
            yield _event("response.in_progress", response={"id": self.pod, "usage": None})
            if self.dies:
                raise httpx.ReadError("pod died during the prefill")
            await asyncio.sleep(PREFILL_SECONDS)
            yield _event("response.output_text.delta", delta="hi")
            usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
                     "output_tokens": 1}  # fmt: skip
            yield _event("response.completed", response={"id": self.pod, "usage": usage})

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        pod = request.url.netloc.decode()
        body = json.loads(request.content)
        named = parse(body["request_id"])  # each attempt names its pod
        assert named is not None and named.pod == endpoint_tag(pod)
        assert "stream_options" not in body
        answered.append(pod)
        stream = Opened(pod, dies=len(answered) == 1)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    runtime = RouterRuntime(make_config(2), transport=httpx.MockTransport(handler))
    await runtime.start()
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=RouterApp(runtime)), base_url="http://r"
    )
    try:
        for _ in range(4):
            answered.clear()
            request = {"model": "m", "input": "hello " * 50, "stream": True}
            resp = await client.post("/v1/responses", json=request)
            assert resp.status_code == 200
            died, served = answered
            assert died != served and resp.headers["x-kvgate-endpoint"] == served
            assert resp.text.count("response.created") == 2  # its event line and type
            assert f'"id": "{served}"' in resp.text and died not in resp.text
            assert resp.text.endswith(_event("response.completed", response={
                "id": served, "usage": {"input_tokens": 10, "input_tokens_details":
                {"cached_tokens": 4}, "output_tokens": 1}}).decode())  # fmt: skip
        page = generate_latest(runtime.metrics.registry).decode()
        ttft = sum_samples(page, ["kvgate_router_ttft_seconds_sum"])
        assert ttft["kvgate_router_ttft_seconds_sum"] >= 4 * PREFILL_SECONDS
    finally:
        await client.aclose()
        await runtime.stop()


def test_what_the_router_assumes_of_vllms_responses_api_holds_in_its_code():
    """vLLM 0.33's own code: the response's id is the request's `request_id` (so the router can
    name the pod in it), the retrieval and cancel routes and query, the stream's opening events
    before any output, `event:` lines, and the not-found answer the router mimics."""
    folder = "vllm/entrypoints/openai/responses"
    with zipfile.ZipFile(vllm_wheel()) as zf:
        protocol, routes, serving = (
            zf.read(f"{folder}/{name}.py").decode()
            for name in ("protocol", "api_router", "serving")
        )
    request = protocol[protocol.index("class ResponsesRequest(") :]
    assert re.search(r'\n    request_id: str = Field\(\s*default_factory=lambda: f"resp_', request)
    assert re.search(r"\n    previous_response_id: str \| None = None", request)
    from_request = protocol[protocol.index("def from_request(") :]
    assert "id=request.request_id," in from_request[: from_request.index("return cls(") + 200]
    assert '@router.get("/v1/responses/{response_id}")' in routes
    assert '@router.post("/v1/responses/{response_id}/cancel")' in routes
    assert "starting_after: int | None = None,\n    stream: bool | None = False," in routes
    assert 'f"event: {event_type}\\ndata: "' in routes
    created = serving.index('type="response.created"')
    in_progress = serving.index('type="response.in_progress"', created)
    assert created < in_progress < serving.index("async for event_data in processor(", in_progress)
    assert "message=f\"Response with id '{response_id}' not found.\"" in serving


def test_anthropic_bodies_key_without_the_billing_header_or_cache_markers():
    system = [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
              {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]  # fmt: skip
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "ok"}],
    }
    turn1 = {"system": system, "messages": [
        {"role": "user", "content": [{**result, "cache_control": {"type": "ephemeral"}}]}]}  # fmt: skip
    other_hash = [{**system[0], "text": "x-anthropic-billing-header: cch=2;"}, system[1]]
    turn2 = {"system": other_hash, "messages": [
        {"role": "user", "content": [result]}, {"role": "assistant", "content": "done"}]}  # fmt: skip
    first, second = request_text(turn1), request_text(turn2)
    assert first.startswith("<|system|>\nYou are Claude Code.\n") and "billing" not in first
    assert second.startswith(first) and len(second) > len(first)
    assert request_text({"system": "plain", "messages": []}) == "<|system|>\nplain\n"


def test_anthropic_usage_counts_the_cached_tokens_in_the_prompt():
    usage = {"input_tokens": 20, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 64,
             "output_tokens": 5}  # fmt: skip
    got = usage_from_json_body(json.dumps({"type": "message", "usage": usage}).encode())
    assert got is not None and (got.prompt_tokens, got.cached_tokens, got.completion_tokens) == (
        384, 300, 5)  # fmt: skip
    tap = SseUsageTap(strip_usage_chunk=False)
    tap.feed(_event("message_start", message={"usage": {"input_tokens": 0, "output_tokens": 0}}))
    tap.feed(_event("message_delta", delta={"stop_reason": "end_turn"}, usage=usage))
    assert tap.usage is not None and tap.usage.cached_tokens == 300
    plain = usage_from_json_body(b'{"usage": {"input_tokens": 7, "output_tokens": 1}}')
    assert plain is not None and (plain.prompt_tokens, plain.cached_tokens) == (7, None)


def test_errors_and_broken_streams_speak_each_apis_shape():
    assert anthropic_error_body(404, "gone") == {
        "type": "error", "error": {"type": "not_found_error", "message": "gone"}}  # fmt: skip
    assert anthropic_error_body(400, "x")["error"]["type"] == "invalid_request_error"
    assert anthropic_error_body(502, "x")["error"]["type"] == "api_error"
    assert stream_error("messages", "broke", "stream").startswith(b"event: error\ndata: ")
    assert b'"type": "error"' in stream_error("responses", "broke", "stream")
    assert stream_error("chat", "broke", "stream").startswith(b'data: {"error"')


def test_claude_codes_metadata_user_id_is_the_session():
    classifier = Classifier(make_config(1))
    body = {"model": "m", "messages": [], "metadata": {"user_id": "user_1_session_abc"}}
    assert classifier.classify(body, {}, "messages").session_id == "user_1_session_abc"
    assert classifier.classify(body, {}, "chat").session_id is None  # OpenAI's metadata
    assert classifier.classify(body, {"x-session-id": "s"}, "messages").session_id == "s"
    odd = {**body, "metadata": {"user_id": 7}}
    assert classifier.classify(odd, {}, "messages").session_id is None


def test_converted_and_pooling_bodies_get_approximate_keys_of_their_text():
    from kvgate.api.router_config import EngineConfig
    from kvgate.router.core.keys import Keyer

    keyer = Keyer(EngineConfig())
    text = "a shared instruction prefix " * 20
    embed = keyer.keys({"model": "m", "input": text + "one"}, "pooling", None)
    again = keyer.keys({"model": "m", "input": text + "two"}, "pooling", None)
    assert not embed.exact and embed.prompt_text is None  # never copied as a completion
    shared = len(text) // keyer.approx.block_chars
    assert embed.block_keys[: shared - 1] == again.block_keys[: shared - 1]
    assert (
        keyer.keys({"model": "m", "query": "q", "documents": ["d"]}, "pooling", None).block_keys
        == []
    )
    responses = keyer.keys({"model": "m", "input": text, "prompt": None}, "responses", None)
    assert responses.block_keys  # a Responses `prompt` field is no completion prompt
    with pytest.raises(RouterError):
        keyer.keys({"model": "m", "messages": []}, "messages", None)


def test_a_request_without_a_model_names_the_one_model_served():
    assert Classifier(make_config(2)).classify({"input": "hi"}, {}, "responses").model == "m"
    two = make_config(1, pools=[
        {"name": "a", "model": "m1", "endpoints": {"static": [{"url": "http://a:8000"}]}},
        {"name": "b", "model": "m2", "endpoints": {"static": [{"url": "http://b:8000"}]}},
    ])  # fmt: skip
    with pytest.raises(RouterError) as err:
        Classifier(two).classify({"input": "hi"}, {}, "responses")
    assert err.value.status == 400 and err.value.param == "model"


def test_token_ids_are_truncated_as_the_engines_truncate_them_without_a_tokenizer():
    """A pool without a tokenizer keys token ids as sent; the engines cut them to
    `truncate_prompt_tokens` first, so the keys matched no block they published."""
    from kvgate.api.router_config import EngineConfig
    from kvgate.router.core.keys import Keyer

    keyer = Keyer(EngineConfig(max_model_len=100))
    ids = list(range(1000, 1400))
    cut = keyer.keys(
        {"model": "m", "prompt": ids, "truncate_prompt_tokens": 64}, "completion", None
    )
    assert (
        cut.block_keys
        == keyer.keys({"model": "m", "prompt": ids[-64:]}, "completion", None).block_keys
    )
    right = {"model": "m", "prompt": ids, "truncate_prompt_tokens": 64, "truncation_side": "right"}
    assert (
        keyer.keys(right, "completion", None).block_keys
        == keyer.keys({"model": "m", "prompt": ids[:64]}, "completion", None).block_keys
    )
    whole = {"model": "m", "prompt": ids, "truncate_prompt_tokens": -1}  # 99 of 400: served
    assert len(keyer.keys(whole, "completion", None).block_keys) == 99 // 16
