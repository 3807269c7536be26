"""What the end of the shutdown grace does to each kind of request still running."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvgate.router.server.drain import Drain

SSE = [(b"content-type", b"text/event-stream")]


async def _serve(
    drain: Drain, handler, path: str = "/v1/chat/completions"
) -> tuple[asyncio.Task, list[dict]]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "path": path}
    task = asyncio.create_task(drain.run(handler, scope, receive, send))
    await asyncio.sleep(0.01)
    return task, sent


async def _stream_forever(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    await asyncio.sleep(3600)


async def _think_forever(scope, receive, send):
    await asyncio.sleep(3600)


async def _answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_streams_get_an_error_event_and_unstarted_requests_a_503():
    cut: list[str] = []
    drain = Drain(on_cut=cut.append)
    stream, stream_sent = await _serve(drain, _stream_forever)
    waiting, waiting_sent = await _serve(drain, _think_forever)
    done, done_sent = await _serve(drain, _answer)
    assert len(drain) == 2  # the finished request is forgotten
    drain.expire()
    await asyncio.wait_for(asyncio.gather(stream, waiting, done), 5)
    last = stream_sent[-1]
    assert last["type"] == "http.response.body" and not last.get("more_body", False)
    event = json.loads(last["body"].removeprefix(b"data: "))
    assert event["error"]["code"] == "shutting_down"
    assert waiting_sent[0]["status"] == 503
    assert json.loads(waiting_sent[1]["body"])["error"]["type"] == "service_unavailable"
    assert [m["type"] for m in done_sent] == ["http.response.start", "http.response.body"]
    assert sorted(cut) == ["stream", "unavailable"]
    assert len(drain) == 0


async def test_a_cancellation_that_is_not_the_drains_passes_through():
    drain = Drain()
    task, sent = await _serve(drain, _think_forever)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent == [] and len(drain) == 0


async def test_the_responses_and_messages_apis_get_their_own_shapes():
    drain = Drain()
    responses, responses_sent = await _serve(drain, _stream_forever, "/v1/responses")
    messages, messages_sent = await _serve(drain, _stream_forever, "/v1/messages")
    waiting, waiting_sent = await _serve(drain, _think_forever, "/v1/messages")
    drain.expire()
    await asyncio.wait_for(asyncio.gather(responses, messages, waiting), 5)
    for sent in (responses_sent, messages_sent):
        event, data = sent[-1]["body"].split(b"\n", 1)
        assert event == b"event: error"
        assert json.loads(data.removeprefix(b"data: "))["type"] == "error"
    assert waiting_sent[0]["status"] == 503
    assert json.loads(waiting_sent[1]["body"])["error"]["type"] == "overloaded_error"
