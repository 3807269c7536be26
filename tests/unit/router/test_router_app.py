import asyncio
import json

import pytest
from tests.unit.router.fakes import FakePods, make_config

from kvgate.api.router_pools import LoraAdapter
from kvgate.router.http.proxy import MAX_ERROR_BODY_BYTES
from kvgate.router.metrics import RouterMetrics
from kvgate.router.server.app import _until_disconnect

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 200}]}


async def test_chat_is_proxied_with_decision_headers(router_app):
    pods = FakePods()
    client, _ = await router_app(make_config(), pods)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert resp.headers["x-kvgate-endpoint"] in ("pod0:8000", "pod1:8000")
    assert resp.headers["x-kvgate-pool"] == "default/p"
    assert resp.headers["x-kvgate-decision"]
    assert int(resp.headers["x-kvgate-prefix-hit-tokens"]) >= 0
    assert len(pods.requests) == 1


async def test_streaming_usage_is_requested_and_stripped(router_app):
    pods = FakePods()
    client, _ = await router_app(make_config(), pods)
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 200
    assert pods.requests[0][1]["stream_options"] == {"include_usage": True}
    assert '"usage"' not in resp.text
    assert resp.text.endswith("data: [DONE]\n\n")
    metrics = (await client.get("/metrics")).text
    cached = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("kvgate_router_cached_tokens_total{")
    ]
    assert sum(cached) == 3  # read from the usage chunk the router stripped


async def test_streaming_usage_kept_when_client_asked(router_app):
    pods = FakePods()
    client, _ = await router_app(make_config(), pods)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert '"usage"' in resp.text


async def test_second_turn_follows_the_first(router_app):
    pods = FakePods()
    client, _ = await router_app(make_config(4), pods)
    first = await client.post("/v1/chat/completions", json=CHAT)
    turn2 = {
        "model": "m",
        "messages": [
            *CHAT["messages"],
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ],
    }
    second = await client.post("/v1/chat/completions", json=turn2)
    assert second.headers["x-kvgate-endpoint"] == first.headers["x-kvgate-endpoint"]
    assert int(second.headers["x-kvgate-prefix-hit-tokens"]) > 0


async def test_connect_failure_is_retried_on_another_pod(router_app):
    pods = FakePods(fail={"pod0:8000"})
    client, _ = await router_app(make_config(2), pods)
    for _ in range(4):
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200
        assert resp.headers["x-kvgate-endpoint"] == "pod1:8000"


async def test_5xx_is_retried_and_exhaustion_is_502(router_app):
    pods = FakePods(status={"pod0:8000": 500, "pod1:8000": 500})
    client, _ = await router_app(make_config(2), pods)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502
    assert resp.json()["error"]["type"] == "upstream_error"
    assert len(pods.requests) == 2


async def test_an_overloaded_pods_503_reaches_the_client_with_its_retry_after(router_app):
    """The SDKs back off by `retry-after`: a 502 without it dropped the pod's hint."""
    for retry_after, expected in (("7", "7"), ("Wed, 21 Oct 2026 07:28:00 GMT", None)):
        pods = FakePods(status={"pod0:8000": 503}, retry_after=retry_after)
        client, _ = await router_app(make_config(1), pods)
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503 and resp.headers.get("retry-after") == expected
        assert resp.json()["error"]["type"] == "upstream_error"


async def test_a_long_error_body_is_not_read_to_its_end(router_app):
    """A 5xx body is read to reuse its connection, and dropped: past 64 KiB the connection is
    not worth its bytes (joining it held up to 16 MiB a request)."""
    pods = FakePods(status={"pod0:8000": 500, "pod1:8000": 500}, error_body_bytes=8 << 20)
    client, _ = await router_app(make_config(2), pods)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502 and len(pods.requests) == 2
    assert 0 < pods.error_bytes_read <= 2 * (MAX_ERROR_BODY_BYTES + (1 << 16))


async def test_client_mistakes_are_4xx_in_openai_shape(router_app):
    client, _ = await router_app(make_config(), FakePods())
    cases = [
        (b"not json", 400),
        (b"[1,2]", 400),
        (json.dumps({"messages": []}).encode(), 400),
        (
            json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(),
            404,
        ),
        (json.dumps({"model": "m", "messages": "x"}).encode(), 400),
        (json.dumps({"model": "m", "messages": [1]}).encode(), 400),
        (json.dumps({"model": "m", "messages": [{"role": "user"}], "cache_salt": 5}).encode(), 400),
    ]
    for payload, status in cases:
        resp = await client.post(
            "/v1/chat/completions", content=payload, headers={"content-type": "application/json"}
        )
        assert resp.status_code == status, (payload, resp.text)
        assert set(resp.json()["error"]) >= {"message", "type", "code"}
    assert (await client.get("/v1/chat/completions")).status_code == 405
    assert (await client.get("/nope")).status_code == 404
    # A client's value is cut short in the message (a 13 MiB model name made a 40 MiB answer).
    huge = {"model": "ü" * 1_000_000, "messages": [{"role": "user", "content": "x"}]}
    resp = await client.post("/v1/chat/completions", json=huge)
    assert resp.status_code == 404 and len(resp.content) < 2048
    ops = {"model": "m", "messages": [{"role": "user", "content": "x"}],
           "cache": {"drop": {"0" * 100_000: [0]}}}  # fmt: skip
    resp = await client.post("/v1/chat/completions", json=ops)
    assert resp.status_code == 400 and len(resp.content) < 2048
    # More query fields than `/debug/route` reads: a 400, not a 500.
    fields = "&".join(f"k{i}=1" for i in range(9))
    assert (await client.post(f"/debug/route?{fields}", json=CHAT)).status_code == 400


async def test_body_size_limit(router_app):
    config = make_config(limits={"max_body_bytes": 2048})
    client, _ = await router_app(config, FakePods())
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 4096}]}
    resp = await client.post("/v1/chat/completions", json=big)
    assert resp.status_code == 413


async def test_model_cards_say_what_vllms_do(router_app):
    """Clients size their context from `max_model_len` and tell adapters by `parent`."""
    config = make_config()
    pool = config.pools[0]
    engine = pool.engine.model_copy(update={"max_model_len": 8192})
    adapters = [LoraAdapter(name="sql", path="/adapters/sql")]
    pools = [pool.model_copy(update={"engine": engine, "lora_adapters": adapters})]
    client, _ = await router_app(config.model_copy(update={"pools": pools}), FakePods())
    cards = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert cards["m"]["root"] == "m" and cards["m"]["parent"] is None
    assert cards["sql"]["root"] == "/adapters/sql" and cards["sql"]["parent"] == "m"
    assert cards["m"]["max_model_len"] == cards["sql"]["max_model_len"] == 8192


async def test_a_pod_without_the_requested_adapter_is_passed_over(router_app):
    """An adapter not loaded on every pod of its pool yet (a rollout adding it, adapters
    loaded at run time): the pod's 404 went to the client, with another pod holding it."""
    config = make_config(2)
    adapters = [LoraAdapter(name="sql", path="/adapters/sql")]
    pools = [config.pools[0].model_copy(update={"lora_adapters": adapters})]
    config = config.model_copy(update={"pools": pools})
    body = {**CHAT, "model": "sql"}
    missing = "The model `sql` does not exist."  # vLLM's answer
    pods = FakePods(status={"pod0:8000": 404}, error_message=missing)
    client, runtime = await router_app(config, pods)
    for _ in range(4):
        got = await client.post("/v1/chat/completions", json=body)
        assert got.status_code == 200 and got.headers["x-kvgate-endpoint"] == "pod1:8000"
    assert runtime.endpoints.get("pod0:8000").healthy(runtime.core.clock())  # no pod failure
    # None with the adapter: a 404 once each was tried. Any other 404 (a Responses follow-up
    # the pod no longer holds, say) is the pod's own answer, passed on as before.
    pods = FakePods(status={"pod0:8000": 404, "pod1:8000": 404}, error_message=missing)
    client, _ = await router_app(config, pods)
    got = await client.post("/v1/chat/completions", json=body)
    assert got.status_code == 404 and got.json()["error"]["code"] == "model_not_loaded"
    assert len(pods.requests) == 2
    pods.error_message = "Response with id 'resp_1' not found."
    got = await client.post("/v1/chat/completions", json=body)
    assert got.status_code == 404 and got.json()["error"]["message"] == pods.error_message
    assert len(pods.requests) == 3


async def test_router_errors_carry_the_request_id_and_a_trailing_slash_is_the_route(router_app):
    client, _ = await router_app(make_config(), FakePods())
    got = await client.post(
        "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers={"x-request-id": "r-1"}
    )
    assert got.status_code == 404 and got.headers["x-request-id"] == "r-1"
    pods = FakePods()
    client, _ = await router_app(make_config(), pods)
    got = await client.post("/v1/chat/completions/", json=CHAT)
    assert got.status_code == 200 and pods.paths == ["/v1/chat/completions"]
    # A pod that echoes the id (vLLM --enable-request-id-headers) does not make it twice.
    assert got.headers.get_list("x-request-id") == [got.headers["x-request-id"]]
    # A relayed request (a token count) carries it to the pod and back too.
    counted = await client.post("/tokenize", json=CHAT, headers={"x-request-id": "r-2"})
    assert counted.status_code == 200 and counted.headers.get_list("x-request-id") == ["r-2"]


async def test_models_health_ready_debug(router_app):
    client, _ = await router_app(make_config(), FakePods())
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["m"]
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/ready")).json() == {"ready": True}
    resp = await client.post("/debug/route", json=CHAT)
    assert resp.status_code == 200
    explained = resp.json()
    assert explained["decision"]["endpoint"] == resp.headers["x-kvgate-endpoint"]
    assert len(explained["decision"]["candidates"]) == 2


def test_metrics_names_are_prefixed():
    metrics = RouterMetrics()
    names = {m.name for m in metrics.registry.collect()}
    assert names and all(n.startswith("kvgate_router_") for n in names)


async def test_access_log_has_one_line_per_request_with_its_id(router_app, caplog):
    import logging

    client, _ = await router_app(make_config(server={"access_log": True}), FakePods())
    with caplog.at_level(logging.INFO, logger="kvgate.router.requests"):
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc-1"})
    lines = [r.getMessage() for r in caplog.records if r.name == "kvgate.router.requests"]
    assert len(lines) == 1
    assert "request_id=abc-1" in lines[0] and "cached_tokens=3" in lines[0]


async def test_a_pods_status_is_a_label_only_if_it_is_a_registered_one(router_app):
    """The pod chooses its status: other three-digit numbers are counted by class, so a pod
    cannot add a series per number (the dashboards' `code!~"2.."` still tells errors apart)."""
    pods = FakePods()
    client, _ = await router_app(make_config(1), pods)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    for status in (404, 418, 429, 299, 460, 461, 498):
        pods.status["pod0:8000"] = status
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == status
    text = (await client.get("/metrics")).text
    codes = sorted(
        line.split('code="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("kvgate_router_requests_total{")
    )
    assert codes == ["200", "2xx", "404", "418", "429", "4xx"]


async def test_a_stream_broken_mid_way_ends_with_an_error_event():
    """...after its pod connection was closed: once a response is complete, uvicorn's `receive`
    reports a disconnect and the request's watcher cancels the task, so a close after that which
    yields (an https pod's, in httpcore) was cut short halfway."""
    import httpx

    from kvgate.router.runtime import RouterRuntime
    from kvgate.router.server.app import RouterApp

    closed: list[bool] = []

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            raise httpx.ReadError("pod died")

        async def aclose(self) -> None:
            await asyncio.sleep(0)  # as httpcore's lock does
            closed.append(True)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    runtime = RouterRuntime(make_config(1), transport=httpx.MockTransport(handler))
    await runtime.start()
    app = RouterApp(runtime)
    closed_at_end: list[bool] = []

    async def watched(scope, receive, send):  # type: ignore[no-untyped-def]
        async def send_watched(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.body" and not message.get("more_body"):
                closed_at_end.append(bool(closed))
            await send(message)

        await app(scope, receive, send_watched)

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=watched), base_url="http://r")
    try:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert resp.status_code == 200
        assert resp.text.startswith('data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        assert '"type": "upstream_error"' in resp.text and "[DONE]" not in resp.text
        assert closed_at_end == [True]
    finally:
        await client.aclose()
        await runtime.stop()


async def test_errors_name_the_offending_parameter(router_app):
    client, _ = await router_app(make_config(), FakePods())
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": "nope"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "messages"


async def test_a_disconnect_takes_back_its_own_cancellation_and_no_one_elses():
    """The client leaves while the request's work runs: `_until_disconnect` reports it and the
    task goes on; a second cancellation landing at the same time (a drain, a shutdown) is not
    swallowed with it."""
    gone = asyncio.Event()

    async def receive() -> dict[str, object]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def run() -> bool:
        return await _until_disconnect(receive, asyncio.sleep(10))

    alone = asyncio.create_task(run())
    await asyncio.sleep(0)
    gone.set()
    assert await alone is True

    gone.clear()
    both = asyncio.create_task(run())
    await asyncio.sleep(0)
    gone.set()
    await asyncio.sleep(0)  # the watcher reads the disconnect and cancels the task
    both.cancel()  # and someone else cancels it too
    with pytest.raises(asyncio.CancelledError):
        await both


async def test_every_response_is_counted_the_routers_own_errors_too(router_app):
    """requests_total counts pods' answers: with every pod failing it stopped, and an outage
    read as no traffic at all."""
    pods = FakePods(fail={"pod0:8000", "pod1:8000"})
    client, runtime = await router_app(make_config(2), pods)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 502
    bad = {**CHAT, "model": "nope"}
    assert (await client.post("/v1/chat/completions", json=bad)).status_code == 404
    for path in ("/health", "/ready", "/metrics"):  # probes and scrapes are no client traffic
        await client.get(path)
    registry = runtime.metrics.registry
    for code in ("502", "404"):
        assert registry.get_sample_value("kvgate_router_responses_total", {"code": code}) == 1
    assert registry.get_sample_value("kvgate_router_responses_total", {"code": "200"}) is None
    assert registry.get_sample_value("kvgate_router_responses_total", {"code": "503"}) is None
