"""Sessions, reload, directory fallback, disconnects: router state over time."""

import asyncio
import logging
from dataclasses import replace

from tests.unit.router.fakes import FakePods, make_config

from kvgate.api.router_config import RouterConfig

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_session_prefix_break_is_counted_with_its_field(router_app):
    client, _ = await router_app(make_config(2), FakePods())
    headers = {"x-session-id": "s1"}
    turn1 = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "q1 " * 50}]}
    turn2 = {
        "model": "m",
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"},
        ],
    }
    for body in (turn1, turn2):
        assert (
            await client.post("/v1/chat/completions", json=body, headers=headers)
        ).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert _metric(metrics, "kvgate_router_prefix_breaks_total{") == 0
    changed = {"role": "system", "content": "Today is Monday. " + SYSTEM["content"]}
    turn3 = {"model": "m", "messages": [changed, *turn2["messages"][1:]]}
    await client.post("/v1/chat/completions", json=turn3, headers=headers)
    metrics = (await client.get("/metrics")).text
    assert 'kvgate_router_prefix_breaks_total{field="content",pool="default/p"} 1.0' in metrics


async def test_prefix_break_in_a_message_key_of_the_clients_own_is_counted_as_other(
    router_app, caplog
):
    client, _ = await router_app(make_config(2), FakePods())
    headers = {"x-session-id": "s1"}
    # A new salt changes every block key; role and content stay: the first difference is the
    # key the client made up (one with "." and "]." in it: it must not pass for "content").
    for turn, key in enumerate(("k0", "x].content", "k2" * 5000)):
        message = {**SYSTEM, key: 1}
        body = {"model": "m", "messages": [message], "cache_salt": str(turn)}
        with caplog.at_level(logging.INFO, logger="kvgate.router.core.sessions"):
            assert (
                await client.post("/v1/chat/completions", json=body, headers=headers)
            ).status_code == 200
    metrics = (await client.get("/metrics")).text
    name = "kvgate_router_prefix_breaks_total{"
    series = [line for line in metrics.splitlines() if line.startswith(name)]
    assert series == ['kvgate_router_prefix_breaks_total{field="other",pool="default/p"} 2.0']
    breaks = [r.getMessage() for r in caplog.records if "prefix break" in r.getMessage()]
    assert len(breaks) == 2
    assert max(len(line) for line in breaks) < 400


async def test_a_large_turn_is_digested_off_the_event_loop(router_app, monkeypatch):
    """Digesting a body costs ~5 ms per MB: a large one's runs in a worker thread (the loop
    serves others meanwhile), and its break is found as a small one's is."""
    import threading

    from kvgate.router.core import sessions

    threads: list[int] = []
    digest = sessions.digest_body

    def recording(body):
        threads.append(threading.get_ident())
        return digest(body)

    monkeypatch.setattr(sessions, "digest_body", recording)
    client, _ = await router_app(make_config(2), FakePods())
    headers = {"x-session-id": "s1"}
    history = [{"role": "user", "content": f"step {i} " + "x" * 4000} for i in range(80)]
    small = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "q"}]}
    large = {"model": "m", "messages": [SYSTEM, *history]}
    changed = {"model": "m", "messages": [SYSTEM, *history[:75], {"role": "user", "content": "?"}]}
    for body in (small, large, changed):
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200
    loop_thread = threading.get_ident()
    assert threads[0] == loop_thread
    assert threads[1] != loop_thread and threads[2] != loop_thread
    metrics = (await client.get("/metrics")).text  # the small turn was all in one prefix
    assert 'kvgate_router_prefix_breaks_total{field="content",pool="default/p"} 1.0' in metrics


async def test_a_pod_that_left_leaves_no_series_behind(router_app):
    """A pod's series outlive it by a grace period (its answers in flight are still counted),
    then go, and an answer that outlived the grace makes none again (a rollout of two pods
    left ~16 series for good); the pod's id is counted again once it joins again."""
    from kvgate.router.metrics import SERIES_GRACE_SECONDS

    client, runtime = await router_app(make_config(2), FakePods())
    for i in range(4):
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{i} " * 50}]}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    pool = "default/p"
    specs = [ep.spec for ep in runtime.endpoints.in_pool(pool)]
    await runtime.endpoints.replace_pool(pool, [s for s in specs if s.id != "pod0:8000"])
    assert 'upstream="pod0:8000"' in (await client.get("/metrics")).text  # the grace
    metrics = runtime.metrics
    metrics.sweep(runtime.core.clock() + SERIES_GRACE_SECONDS)
    metrics.child(metrics.requests, pool, "pod0:8000", "online", "prefix-hit", "200").inc()
    text = (await client.get("/metrics")).text
    assert 'upstream="pod0:8000"' not in text and 'upstream="pod1:8000"' in text
    await runtime.endpoints.replace_pool(pool, specs)
    assert 'upstream="pod0:8000"' in (await client.get("/metrics")).text


async def test_a_pool_that_left_leaves_no_series_behind(router_app):
    """A pool taken out of the configuration kept ~265 series for good (its histograms, queue
    gauges, directory operations): the directory's go with its index, the router's after the
    grace that counts the answers in flight."""
    from kvgate.router.metrics import SERIES_GRACE_SECONDS

    client, runtime = await router_app(make_config(2), FakePods())
    for i in range(4):
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{i} " * 50}]}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert 'pool="default/p"' in (await client.get("/metrics")).text
    pods = {"static": [{"url": f"http://pod{i}:8000"} for i in range(2)]}
    await runtime.reload(make_config(pools=[{"name": "q", "model": "m", "endpoints": pods}]))
    text = (await client.get("/metrics")).text
    assert (
        'kvgate_directory_operations_total{operation="lookup",outcome="ok",pool="default/p"}'
        not in text
    )
    assert 'pool="default/q"' in text
    core = runtime.core
    later = core.clock() + SERIES_GRACE_SECONDS
    core.clock = lambda: later  # a scrape past the grace removes them
    assert 'pool="default/p"' not in (await client.get("/metrics")).text
    # A pool that comes back within the grace keeps its series.
    await runtime.reload(make_config(2))
    latest = later + SERIES_GRACE_SECONDS
    core.clock = lambda: latest
    assert 'pool="default/p"' in (await client.get("/metrics")).text


async def test_a_pod_whose_spec_changes_keeps_its_connections(router_app):
    """A pod re-created under its name and address (a new generation) leaves and joins in one
    change: its host was made known, then forgotten, and no connection to it was kept again."""
    _client, runtime = await router_app(make_config(2), FakePods())
    known: set[str] = set()
    runtime.upstream.know = known.add  # type: ignore[method-assign]
    runtime.upstream.forget = known.discard  # type: ignore[method-assign]
    specs = [ep.spec for ep in runtime.endpoints.in_pool("default/p")]
    renewed = replace(specs[0], generation="uid-2")
    await runtime.endpoints.replace_pool("default/p", [renewed, specs[1]])
    assert known == {renewed.url}
    await runtime.endpoints.replace_pool("default/p", [specs[1]])
    assert known == set()


async def test_reload_adds_endpoints_and_keeps_state(router_app):
    client, runtime = await router_app(make_config(1), FakePods())
    await client.post("/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
    kept = runtime.endpoints.get("pod0:8000")
    await runtime.reload(make_config(3))
    assert {ep.id for ep in runtime.endpoints.all()} == {"pod0:8000", "pod1:8000", "pod2:8000"}
    assert runtime.endpoints.get("pod0:8000") is kept
    await runtime.reload(make_config(1, policy={"name": "round-robin"}))
    assert [ep.id for ep in runtime.endpoints.all()] == ["pod0:8000"]
    assert runtime.core.state.policy.name == "round-robin"


async def test_departed_pod_is_forgotten_by_the_directory(router_app):
    _client, runtime = await router_app(make_config(2), FakePods())
    index = runtime.indexes["default/p"]
    await index.add_approximate("pod1:8000", [b"k" * 32], 60)
    assert await index.lookup([b"k" * 32]) == {"pod1:8000": 1}
    await runtime.reload(make_config(1))
    assert await index.lookup([b"k" * 32]) == {}


async def test_client_disconnect_cancels_upstream(router_app):
    import httpx

    started = asyncio.Event()
    cancelled = asyncio.Event()

    class SlowStream(httpx.AsyncByteStream):
        async def __aiter__(self):
            started.set()
            try:
                await asyncio.sleep(30)
                yield b""
            except asyncio.CancelledError:
                cancelled.set()
                raise

    from kvgate.router.runtime import RouterRuntime
    from kvgate.router.server.app import RouterApp

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=SlowStream()
        )

    runtime = RouterRuntime(make_config(1), transport=httpx.MockTransport(handler))
    await runtime.start()
    app = RouterApp(runtime)
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    disconnect = asyncio.Event()

    async def receive():
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        return None

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    task = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(started.wait(), 5)
    disconnect.set()
    await asyncio.wait_for(task, 5)
    await asyncio.wait_for(cancelled.wait(), 5)
    assert runtime.core.endpoint_load()["pod0:8000"] == 0
    await runtime.stop()


async def test_reload_keeps_warm_keyers_of_unchanged_pools(router_app):
    _client, runtime = await router_app(make_config(2), FakePods())
    before = runtime.core.state.keyer_by_pool["default/p"]
    await runtime.reload(make_config(3))
    assert runtime.core.state.keyer_by_pool["default/p"] is before
    changed = make_config(3)
    pool = changed.pools[0].model_copy(
        update={"engine": changed.pools[0].engine.model_copy(update={"block_size": 32})}
    )
    await runtime.reload(changed.model_copy(update={"pools": [pool]}))
    assert runtime.core.state.keyer_by_pool["default/p"] is not before


async def test_kubernetes_pod_that_terminates_leaves_routing_and_directory(monkeypatch):
    from types import SimpleNamespace

    import httpx

    from kvgate.router.runtime import RouterRuntime

    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # the watch never connects in a unit test
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "namespace": "ns",
                    "model": "m",
                    "engine": {"kv_events": False},
                    "endpoints": {"kubernetes": {"service": "engine"}},
                }
            ]
        }
    )
    runtime = RouterRuntime(config, transport=httpx.MockTransport(FakePods().handler))
    await runtime.start()
    try:
        discovery = runtime.discoveries["ns/p"]

        def endpoint(name, ready, terminating=False):
            return SimpleNamespace(
                addresses=["10.0.0.1" if name == "a" else "10.0.0.2"],
                conditions=SimpleNamespace(ready=ready, serving=ready, terminating=terminating),
                target_ref=SimpleNamespace(kind="Pod", name=name, namespace="ns", uid=f"u-{name}"),
            )

        def endpoint_slice(*endpoints):
            return SimpleNamespace(
                metadata=SimpleNamespace(name="engine-x", namespace="ns"),
                address_type="IPv4",
                ports=[SimpleNamespace(name="http", port=8000)],
                endpoints=list(endpoints),
            )

        discovery._slices = {"engine-x": endpoint_slice(endpoint("a", True), endpoint("b", True))}
        await discovery._publish()
        assert {ep.id for ep in runtime.endpoints.all()} == {"ns/a", "ns/b"}
        index = runtime.indexes["ns/p"]
        await index.add_approximate("ns/b", [b"k" * 32], 60)
        assert await index.lookup([b"k" * 32]) == {"ns/b": 1}
        # The watch reports b deleted: terminating, still serving.
        discovery._slices["engine-x"] = endpoint_slice(
            endpoint("a", True), endpoint("b", False, terminating=True)
        )
        discovery._slices["engine-x"].endpoints[1].conditions.serving = True
        await discovery._publish()
        assert {ep.id for ep in runtime.endpoints.all()} == {"ns/a"}
        assert await index.lookup([b"k" * 32]) == {}
    finally:
        await runtime.stop()


async def test_directory_size_gauges_are_kept_current():
    import httpx

    from kvgate.router.runtime import RouterRuntime
    from kvgate.router.server.app import RouterApp

    runtime = RouterRuntime(
        make_config(2),
        transport=httpx.MockTransport(FakePods().handler),
        stats_interval_seconds=0.02,
    )
    await runtime.start()
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=RouterApp(runtime)), base_url="http://r"
    )
    try:
        await client.post("/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
        name = 'kvgate_directory_entries{kind="approximate",pool="default/p"}'
        value = 0.0
        for _ in range(100):
            await asyncio.sleep(0.02)
            lines = [
                ln for ln in (await client.get("/metrics")).text.splitlines() if ln.startswith(name)
            ]
            value = float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0
            if value > 0:
                break
        assert value > 0
    finally:
        await client.aclose()
        await runtime.stop()
