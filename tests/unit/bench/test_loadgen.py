"""Load generator against an in-process ASGI-free mock transport (httpx.MockTransport)."""

import asyncio
import gc
import json
import time

import httpx

from kvgate.bench.loadgen import _TEXT_VALUE, LoadGenerator, carries_text, parse_usage
from kvgate.bench.workload import Session, Workload, completion_request, token_text


def _sse(prompt_tokens: int, cached: int, completion: int) -> bytes:
    chunks = [{"choices": [{"index": 0, "text": "x"}], "usage": None} for _ in range(completion)]
    chunks.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return body.encode()


def _handler(seen: list[httpx.Request]):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = json.loads(request.content)
        if body["prompt"] == token_text([666]):
            return httpx.Response(503, json={"error": {"message": "busy"}})
        n = len(body["prompt"]) // 4
        return httpx.Response(
            200,
            content=_sse(n, n // 2, body["max_tokens"]),
            headers={"x-kvgate-endpoint": "pod-a", "content-type": "text/event-stream"},
        )

    return handle


def test_first_token_is_the_first_chunk_with_text():
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    token = {"choices": [{"index": 0, "delta": {"content": " the"}}]}
    completion = {"choices": [{"index": 0, "text": " of"}]}
    assert not carries_text(f"data: {json.dumps(role_only)}")
    assert carries_text(f"data: {json.dumps(token)}")
    assert carries_text(f"data: {json.dumps(completion)}")
    assert not carries_text("data: [DONE]") and not carries_text("")
    assert not carries_text('data: {"choices": [], "usage": {"prompt_tokens": 1}}')
    for line, has_text in (
        (f"data: {json.dumps(role_only)}", False),
        (f"data: {json.dumps(token)}", True),
        (f"data: {json.dumps(completion)}", True),
        ('data: {"choices":[{"index":0,"text":"x"}]}', True),
        ('data: {"choices":[{"index":0,"delta":{"content":""}}]}', False),
    ):
        assert bool(_TEXT_VALUE.search(line.encode())) is has_text, line


def test_parse_usage_only_from_usage_chunks():
    assert parse_usage('data: {"choices": [], "usage": null}') is None
    assert parse_usage("data: [DONE]") is None
    assert parse_usage('data: {"usage": {"prompt_tokens": 3}}') == {"prompt_tokens": 3}


async def test_open_loop_and_sessions_record_usage_headers_and_errors():
    seen: list[httpx.Request] = []
    turn1 = completion_request("s-t0", [1, 2], 2, 0, session_id="s")
    turn2 = completion_request("s-t1", [1, 2, 3, 4], 3, 0, session_id="s")
    workload = Workload(
        name="w",
        requests=(
            completion_request("a", [1] * 10, 4, 0.0),
            completion_request("bad", [666], 4, 0.01),
            completion_request("late", [1], 4, 5.0),  # beyond the duration: never sent
        ),
        sessions=(Session("s", 0.0, (turn1, turn2)),),
    )
    done = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler(seen))) as client:
        gen = LoadGenerator(client, "http://target", "m", duration_s=1.0, progress=done.append)
        records, health = await gen.run(workload)
    by_id = {r.request_id: r for r in records}
    assert set(by_id) == {"a", "bad", "s-t0", "s-t1"}
    assert len(done) == 4
    a = by_id["a"]
    assert a.ok and a.endpoint == "pod-a"
    assert (a.prompt_tokens, a.cached_tokens, a.completion_tokens) == (10, 5, 4)
    assert a.ttft_s is not None and a.e2e_s is not None and a.ttft_s <= a.e2e_s
    assert not by_id["bad"].ok and by_id["bad"].status == 503 and "busy" in by_id["bad"].error
    assert by_id["s-t1"].sent_s >= by_id["s-t0"].end_s  # closed loop: the next turn waits
    sent = {json.loads(r.content)["prompt"]: r for r in seen}
    body = json.loads(sent[token_text([1] * 10)].content)
    assert body["stream"] is True and body["model"] == "m"
    assert body["stream_options"] == {"include_usage": True}
    session_requests = [r for r in seen if r.headers.get("x-session-id") == "s"]
    assert len(session_requests) == 2
    assert health.max_send_lag_s >= 0 and health.late_sends <= 4


async def test_a_stalled_loop_is_reported_with_its_time_and_the_collector_is_unfrozen():
    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(0.4)  # a handler that blocks the event loop, as a busy client would
        return httpx.Response(200, content=_sse(1, 0, 1))

    workload = Workload(name="w", requests=(completion_request("a", [1], 1, 0.1),))
    async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
        records, health = await LoadGenerator(client, "http://target", "m").run(workload)
    (stall_end_s, stall_s), *_ = health.loop_stalls
    assert stall_s >= 0.3 and 0.1 < stall_end_s <= records[0].end_s + 0.1
    assert health.client_limited(len(records))
    assert gc.get_freeze_count() == 0  # the workload was frozen only while it ran


async def test_a_responses_stream_is_timed_at_its_first_delta_and_its_usage_read():
    """The opening events (the request echoed, `usage: null`) are not a token; the usage is
    the last event's, however long the response object before it."""
    from kvgate.bench.workload import RESPONSES, BenchRequest

    def event(kind: str, **fields: object) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()

    usage = {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 2}
    echo = {"instructions": "x" * 20_000, "text": {"format": {"type": "text"}}, "usage": None}
    stream = (
        event("response.created", response=echo)
        + event("response.content_part.added", part={"type": "output_text", "text": ""})
        + event("response.output_text.delta", delta="hi")
        + event("response.completed", response={**echo, "output": [], "usage": usage})
    )
    seen: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        chunks = [stream[: stream.index(b"event: response.output_text.delta")]]
        chunks.append(stream[len(chunks[0]) :])

        class Slow(httpx.AsyncByteStream):
            async def __aiter__(self):
                yield chunks[0]
                await asyncio.sleep(0.05)
                yield chunks[1]

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Slow())

    turn = BenchRequest(
        request_id="r", path=RESPONSES, body={"input": "hi"}, max_tokens=2, prefix_units=()
    )
    workload = Workload(name="w", requests=(turn,))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        records, _ = await LoadGenerator(client, "http://target", "m", duration_s=1.0).run(workload)
    (record,) = records
    assert record.ok, record.error
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (40, 32, 2)
    assert record.ttft_s is not None and record.ttft_s >= 0.05
    assert "stream_options" not in seen[0] and seen[0]["stream"] is True


def test_anthropic_usage_counts_the_cache_reads_in_the_prompt():
    from kvgate.bench.loadgen import apply_usage, last_usage
    from kvgate.bench.records import RequestRecord

    tail = (b'event: message_delta\ndata: {"type":"message_delta","delta":{},"usage":'
            b'{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":88,'
            b'"cache_creation_input_tokens":32}}\n\n'
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n')  # fmt: skip
    usage = last_usage(tail)
    assert usage is not None
    record = RequestRecord(request_id="r", request_class="online", session_id=None,
                           scheduled_s=0.0, sent_s=0.0)  # fmt: skip
    apply_usage(record, usage)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (132, 88, 3)


async def test_a_messages_stream_that_breaks_is_an_error_not_a_success():
    from kvgate.bench.workload import MESSAGES, BenchRequest

    start = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
             b'{"input_tokens":50,"output_tokens":0}}}\n\n'
             b'event: content_block_delta\ndata: {"type":"content_block_delta",'
             b'"delta":{"type":"text_delta","text":"hi"}}\n\n')  # fmt: skip
    broken = b'event: error\ndata: {"type":"error","error":{"type":"api_error"}}\n\n'
    endings = {"cut": start, "error": start + broken}

    def handle(request: httpx.Request) -> httpx.Response:
        body = endings[json.loads(request.content)["messages"][0]["content"]]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    turns = tuple(
        BenchRequest(request_id=name, path=MESSAGES, max_tokens=2, prefix_units=(),
                     body={"messages": [{"role": "user", "content": name}], "max_tokens": 2})
        for name in endings
    )  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        generator = LoadGenerator(client, "http://target", "m", duration_s=1.0)
        records, _ = await generator.run(Workload(name="w", requests=turns))
    by_id = {r.request_id: r for r in records}
    assert "terminal event" in (by_id["cut"].error or "")
    assert "api_error" in (by_id["error"].error or "")


async def test_a_chained_session_names_the_answer_before():
    from kvgate.bench.workload import PREVIOUS_RESPONSE, RESPONSES, BenchRequest

    seen: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        rid = f"resp_{len(seen)}"
        events = (
            f'event: response.created\ndata: {{"response":{{"id":"{rid}"}},"type":"response.created"}}\n\n'
            'event: response.output_text.delta\ndata: {"delta":"x","type":"response.output_text.delta"}\n\n'
            f'event: response.completed\ndata: {{"response":{{"id":"{rid}","usage":'
            '{"input_tokens":3,"output_tokens":1}},"type":"response.completed"}\n\n'
        )  # fmt: skip
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events)

    turns = tuple(
        BenchRequest(request_id=f"s-t{i}", path=RESPONSES, max_tokens=1, prefix_units=(),
                     session_id="s", body={"input": "x", **({"previous_response_id":
                     PREVIOUS_RESPONSE} if i else {})})
        for i in range(3)
    )  # fmt: skip
    workload = Workload(name="w", requests=(), sessions=(Session("s", 0.0, turns),))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        records, _ = await LoadGenerator(client, "http://target", "m", duration_s=5.0).run(workload)
    assert all(r.ok for r in records) and [r.response_id for r in records] == [
        "resp_1", "resp_2", "resp_3"]  # fmt: skip
    assert [b.get("previous_response_id") for b in seen] == [None, "resp_1", "resp_2"]
