"""Warm-up of pods that join: the hot-prefix memory, the phases, and the core's hooks."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from tests.unit.router.fakes import FakePods, make_config, routing_core

from kvgate.api.fleet import WarmupConfig
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore

SYSTEM = list(range(1000, 1512))  # 512 tokens: 32 blocks of 16


def _body(question: int, system: list[int] = SYSTEM) -> dict[str, object]:
    return {"model": "m", "prompt": system + [question] * 40, "max_tokens": 4}


async def _core(n: int = 2, **warmup: object) -> tuple[RoutingCore, EndpointSet, list[float]]:
    now = [100.0]
    core, endpoints = await routing_core(make_config(n, warmup=warmup), now, n)
    return core, endpoints, now


def _specs(pool: str, n: int) -> list[EndpointSpec]:
    return [EndpointSpec(f"pod{i}:8000", pool, f"http://pod{i}:8000") for i in range(n)]


async def _send(core: RoutingCore, count: int, system: list[int] = SYSTEM) -> None:
    for i in range(count):
        await core.plan(ClientRequest(_body(i, system), {}, "completion"))


async def test_a_prefix_many_requests_share_is_remembered_with_its_tokens_and_ranked_first():
    core, _, now = await _core()
    await _send(core, 5)
    other = list(range(5000, 5100))  # 100 tokens, seen twice: its 4-block prefix is shared
    await _send(core, 2, other)
    top = core.warmup.hot.top("default/p", 8, now[0])
    assert top[0].tokens is not None and top[0].tokens.tolist() == SYSTEM
    assert top[0].decayed(now[0], 600) == pytest.approx(5)
    # shorter prefixes of the system prompt are covered by it, not listed again
    assert all(p.tokens is not None and p.tokens.tolist()[:1] != SYSTEM[:1] for p in top[1:])
    assert any(p.tokens is not None and p.tokens.tolist() == other[:64] for p in top)


async def test_a_prefix_seen_once_is_only_a_candidate():
    core, _, now = await _core()
    await _send(core, 1)
    assert core.warmup.hot.top("default/p", 8, now[0]) == []
    assert len(core.warmup.hot) == 0


async def test_a_prefix_seen_min_requests_times_a_while_apart_is_hot():
    """A count decays between requests: two a second apart count 1.999, short of 2, so a
    prefix needed a third request (documented: `min_requests`, 2)."""
    core, _, now = await _core()
    await _send(core, 1)
    now[0] += 1.0
    await _send(core, 1)
    assert [p.token_count for p in core.warmup.hot.top("default/p", 8, now[0])] == [len(SYSTEM)]


async def test_a_prompt_keyed_with_its_cache_ops_offers_no_prefix_to_warm():
    """Its keys carry its drops: sent to a joining pod as a plain prompt, the copy was stored
    under keys no turn of the session looks up (1,024 tokens prefilled, 480 of them used)."""
    now = [100.0]
    pods = {"static": [{"url": f"http://pod{i}:8000"} for i in range(2)]}
    pool = {"name": "p", "model": "m", "engine": {"cache_ops": True}, "endpoints": pods}
    core, _ = await routing_core(make_config(pools=[pool]), now, 2)
    segment = 160
    prompt = [100 + (i * 131 + t * 17) % 2900 for i in range(6) for t in range(segment)]
    cache = {"segments": [segment] * 6, "drop": {"2": [1], "3": [2], "4": [3]}}
    for _ in range(3):
        body = {"model": "m", "prompt": prompt, "max_tokens": 2, "cache": cache}
        plan = await core.plan(ClientRequest(body, {}, "completion"))
        assert plan.keys.lookup is not None
    assert core.warmup.hot.top("default/p", 8, now[0]) == []
    for _ in range(3):  # the same tokens without ops are a prefix to warm
        await core.plan(ClientRequest({"model": "m", "prompt": prompt}, {}, "completion"))
    assert core.warmup.hot.top("default/p", 8, now[0])


async def test_a_prefix_with_an_id_beyond_every_vocabulary_is_not_remembered():
    """The memory keeps ids in 4 bytes; an id of 2^32 or more fits no vocabulary (the pods
    answer 400): its prefix is not remembered, and its requests are routed as any other."""
    core, _, now = await _core()
    await _send(core, 5, [2**40, *SYSTEM])
    assert core.warmup.hot.top("default/p", 8, now[0]) == []


async def test_memory_is_bounded_in_entries_and_bytes():
    core, _, _now = await _core(remembered_prefixes=3, top_prefixes=3, max_bytes=4 * 600)
    for group in range(10):
        await _send(core, 2, list(range(group * 1000, group * 1000 + 512)))
    hot = core.warmup.hot
    assert len(hot) <= 3
    assert hot.bytes <= 4 * 600


async def test_counts_decay_with_their_half_life():
    core, _, now = await _core(half_life_seconds=10.0)
    await _send(core, 4)
    top = core.warmup.hot.top("default/p", 1, now[0] + 20)
    assert top[0].decayed(now[0] + 20, 10.0) == pytest.approx(1.0)


async def test_a_pod_that_joins_gets_the_hot_prefixes_and_no_client_request_until_warm():
    core, endpoints, now = await _core(ramp_seconds=10.0)
    await _send(core, 4)
    pool = "default/p"
    await endpoints.replace_pool(pool, _specs(pool, 3))
    requests = core.warmup.take()
    assert [r.endpoint_id for r in requests] == ["pod2:8000"]
    body = requests[0].body()
    assert body["prompt"] == SYSTEM and body["max_tokens"] == 1 and body["model"] == "m"
    assert core.warmup.take() == []  # handed out once
    for i in range(20):
        plan = await core.plan(ClientRequest(_body(100 + i), {}, "completion"))
        assert plan.endpoint.id != "pod2:8000"
    state = core.warmup.debug(now[0], endpoints.all())
    assert state["endpoints"][2]["phase"] == "warming"

    core.warmup.request_done(requests[0], now[0], ok=True, prompt_tokens=len(SYSTEM))
    state = core.warmup.debug(now[0], endpoints.all())["endpoints"][2]
    assert state["phase"] == "ramping" and state["traffic_share"] == 0.0
    assert state["succeeded"] == 1 and state["prefill_tokens"] == len(SYSTEM)
    rng = random.Random(0)
    now[0] += 5.0  # half way through the ramp: about half the requests may go there
    share = sum(core.warmup.admits("pod2:8000", now[0], rng) for _ in range(1000)) / 1000
    assert 0.4 < share < 0.6
    now[0] += 5.0
    assert core.warmup.admits("pod2:8000", now[0], rng)
    assert core.warmup.debug(now[0], endpoints.all())["endpoints"][2]["phase"] == "warm"


async def test_a_warm_up_that_never_answers_ends_at_its_timeout():
    core, endpoints, now = await _core(timeout_seconds=30.0, ramp_seconds=0.0)
    await _send(core, 3)
    await endpoints.replace_pool("default/p", _specs("default/p", 3))
    assert core.warmup.take()
    rng = random.Random(0)
    assert not core.warmup.admits("pod2:8000", now[0] + 29.0, rng)
    assert core.warmup.admits("pod2:8000", now[0] + 30.0, rng)
    assert core.warmup.deadline("pod2:8000") is None


async def test_pods_present_at_start_and_pods_with_nothing_hot_are_not_held_back():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    assert core.warmup.take() == []  # the first pods of a pool: nothing to shift traffic from
    await endpoints.replace_pool("default/p", _specs("default/p", 3))  # nothing hot yet
    assert core.warmup.take() == []
    assert core.warmup.admits("pod2:8000", now[0], random.Random(0))


async def test_a_warming_pod_takes_requests_when_no_other_pod_can():
    core, endpoints, _ = await _core()
    await _send(core, 3)
    await endpoints.replace_pool("default/p", _specs("default/p", 3))
    assert core.warmup.take()
    for ep in endpoints.all()[:2]:
        ep.draining = True
    plan = await core.plan(ClientRequest(_body(7), {}, "completion"))
    assert plan.endpoint.id == "pod2:8000"


async def test_a_warming_pod_takes_requests_when_every_other_pod_is_ejected():
    """The warm-up's fail-open saw only that other pods passed its filter, not that they were
    ejected: a request went to a hung, ejected pod while the warming one idled."""
    core, endpoints, now = await _core()
    await _send(core, 3)
    await endpoints.replace_pool("default/p", _specs("default/p", 3))
    assert core.warmup.take()
    limits = core.state.config.limits
    for ep in endpoints.all()[:2]:
        for _ in range(limits.eject_after_failures):
            ep.answers.failed(now[0], limits.eject_after_failures, limits.eject_seconds)
        assert not ep.healthy(now[0])
    plan = await core.plan(ClientRequest(_body(7), {}, "completion"))
    assert plan.endpoint.id == "pod2:8000"


async def test_warm_up_off_sends_nothing():
    core, endpoints, _ = await _core(enabled=False)
    await _send(core, 4)
    await endpoints.replace_pool("default/p", _specs("default/p", 3))
    assert core.warmup.take() == []
    assert len(core.warmup.hot) == 0


def test_top_prefixes_cannot_exceed_remembered_prefixes():
    with pytest.raises(ValueError, match="top_prefixes"):
        WarmupConfig(top_prefixes=10, remembered_prefixes=5)


async def test_a_longer_prefix_takes_the_place_of_the_shorter_ones_it_starts_with():
    core, _, now = await _core()
    await _send(core, 5)
    await _send(core, 12, SYSTEM[:256] + list(range(9000, 9300)))  # only the first half shared
    prefixes = [p.tokens.tolist() for p in core.warmup.hot.top("default/p", 8, now[0]) if p.tokens]
    assert SYSTEM in prefixes
    assert all(p[:256] == SYSTEM[:256] for p in prefixes)  # no shorter prefix of either
    assert all(len(p) > 256 for p in prefixes)


async def test_admin_warm_sends_the_top_prefixes_of_a_model_to_every_pod(router_app, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    pods = FakePods()
    client, _ = await router_app(make_config(2, admin={"token": {"file": str(token)}}), pods)
    for i in range(4):
        assert (await client.post("/v1/completions", json=_body(i))).status_code == 200
    good = {"authorization": "Bearer s3cret"}
    resp = await client.post("/admin/warm", json={"top": 1, "model": "m"}, headers=good)
    assert resp.status_code == 200, resp.text
    (prefix,) = resp.json()["prefixes"]
    assert prefix["prompt_tokens"] == len(SYSTEM)
    assert sorted(r["endpoint"] for r in prefix["results"]) == ["pod0:8000", "pod1:8000"]
    assert all(r["status"] == 200 for r in prefix["results"])
    warm = [body for _, body in pods.requests[-2:]]
    assert all(b["prompt"] == SYSTEM and b["max_tokens"] == 1 for b in warm)
    bad = await client.post("/admin/warm", json={"top": 0, "model": "m"}, headers=good)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top"
    bad = await client.post("/admin/warm", json={"top": 1, "model": "m", "x": 1}, headers=good)
    assert bad.status_code == 400


async def test_debug_warm_reports_phases_and_hot_prefixes(router_app):
    client, _ = await router_app(make_config(2), FakePods())
    for i in range(3):
        await client.post("/v1/completions", json=_body(i))
    debug = (await client.get("/debug/warm")).json()
    assert [e["phase"] for e in debug["endpoints"]] == ["warm", "warm"]
    assert debug["top"]["default/p"][0]["tokens"] == len(SYSTEM)
    assert debug["hot_prefix_bytes"] > 0


async def test_metrics_show_each_pods_warm_phase_as_of_now(router_app):
    """A phase moved only when a request was routed or /debug/warm read: a quiet pool's pod
    showed `ramping` (or `warming`, past its timeout) on the dashboards for good."""
    client, runtime = await router_app(make_config(2, warmup={"ramp_seconds": 5.0}), FakePods())
    for i in range(3):
        await client.post("/v1/completions", json=_body(i))
    specs = [ep.spec for ep in runtime.endpoints.in_pool("default/p")]
    joining = replace(specs[0], id="pod2:8000", url="http://pod2:8000")
    await runtime.endpoints.replace_pool("default/p", [*specs, joining])
    core = runtime.core
    phase = (
        'kvgate_router_endpoint_warm_phase{phase="ramping",pool="default/p",upstream="pod2:8000"}'
    )
    for _ in range(250):  # the warmer sends the hot prefixes; then the pod ramps
        if f"{phase} 1.0" in (await client.get("/metrics")).text:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the pod never ramped")
    later = core.clock() + 6.0
    core.clock = lambda: later
    assert f"{phase} 0.0" in (await client.get("/metrics")).text


async def test_debug_warm_shows_tenants_hot_prefixes_to_the_admin_only(router_app, tmp_path):
    """Tenants' names and what they send often are theirs: without the admin token,
    `/debug/warm` lists the prefixes of requests that named no tenant only."""
    token = tmp_path / "token"
    token.write_text("s3cret")
    tenants = {"tenants": [{"name": "acme-legal", "api_keys": [{"value": "key-a"}]}]}
    config = make_config(2, admin={"token": {"file": str(token)}}, tenants=tenants)
    client, _ = await router_app(config, FakePods())
    for i in range(3):
        await client.post(
            "/v1/completions", json=_body(i), headers={"authorization": "Bearer key-a"}
        )
    admin = {"authorization": "Bearer s3cret"}
    seen = (await client.get("/debug/warm", headers=admin)).json()["top"]["default/p"]
    assert [p["tenant"] for p in seen] == ["acme-legal"]
    for headers in ({}, {"authorization": "Bearer key-a"}, {"authorization": "Bearer nope"}):
        assert (await client.get("/debug/warm", headers=headers)).json()["top"]["default/p"] == []


async def _join_third_pod(runtime) -> None:  # type: ignore[no-untyped-def]
    pool = "default/p"
    specs = [ep.spec for ep in runtime.endpoints.in_pool(pool)]
    specs.append(EndpointSpec("pod2:8000", pool, "http://pod2:8000"))
    await runtime.endpoints.replace_pool(pool, specs)
    for _ in range(100):  # the warmer's tasks run on this loop
        if not runtime.warmer._tasks:
            break
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("fails", [False, True])
async def test_the_warmer_sends_the_hot_prefixes_to_a_pod_that_joins(router_app, fails):
    pods = FakePods()
    if fails:
        pods.fail.add("pod2:8000")
    config = make_config(2, warmup={"ramp_seconds": 0.0})
    client, runtime = await router_app(config, pods)
    for i in range(3):
        assert (await client.post("/v1/completions", json=_body(i))).status_code == 200
    await _join_third_pod(runtime)
    state = next(e for e in (await client.get("/debug/warm")).json()["endpoints"]
                 if e["endpoint"] == "pod2:8000")  # fmt: skip
    assert state["phase"] == "warm" and state["warm_requests"] == 1
    metrics = (await client.get("/metrics")).text
    if fails:  # a pod that cannot be warmed is not held back
        assert state["failed"] == 1
        assert 'kvgate_router_warm_requests_total{pool="default/p",result="error"} 1.0' in metrics
        return
    assert state["succeeded"] == 1
    warm = [body for host, body in pods.requests if host == "pod2:8000"]
    assert warm == [{"model": "m", "prompt": SYSTEM, "max_tokens": 1, "stream": False}]
    assert 'kvgate_router_warm_requests_total{pool="default/p",result="ok"} 1.0' in metrics
    assert 'kvgate_router_warmups_total{pool="default/p",result="warmed"} 1.0' in metrics


async def test_an_answer_from_an_earlier_warm_up_does_not_end_the_next_one():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3)
    pool = "default/p"
    await endpoints.replace_pool(pool, _specs(pool, 3))
    (old,) = core.warmup.take()
    await endpoints.replace_pool(pool, _specs(pool, 2))  # it left ...
    now[0] += 1.0
    await endpoints.replace_pool(pool, _specs(pool, 3))  # ... and came back
    (new,) = core.warmup.take()
    core.warmup.request_done(old, now[0], ok=True)
    assert core.warmup.deadline("pod2:8000") is not None  # still warming
    core.warmup.request_done(new, now[0], ok=True)
    assert core.warmup.deadline("pod2:8000") is None


async def test_a_stopped_router_starts_no_warm_request(router_app, monkeypatch):
    pods = FakePods()
    client, runtime = await router_app(make_config(2, warmup={"ramp_seconds": 0.0}), pods)
    for i in range(3):
        assert (await client.post("/v1/completions", json=_body(i))).status_code == 200
    stopped: list[str] = []
    for name in ("warm_sharer", "warmer", "load_sharer"):
        part = getattr(runtime, name)

        async def stop(part=part, name=name) -> None:  # type: ignore[no-untyped-def]
            stopped.append(name)
            await type(part).stop(part)

        monkeypatch.setattr(part, "stop", stop)
    await runtime.stop()
    # what feeds the warmer (the warm-up exchange's claims) stops before it
    assert stopped.index("warm_sharer") < stopped.index("warmer")
    # a pod that joins now (a late discovery event, or a claim answered during shutdown): its
    # warm request stays queued in the core, no task is left to send it over the closed upstream
    pool = "default/p"
    specs = [ep.spec for ep in runtime.endpoints.in_pool(pool)]
    await runtime.endpoints.replace_pool(pool, [*specs, EndpointSpec("pod2:8000", pool, "x")])
    runtime.warmer.dispatch()
    assert runtime.warmer._tasks == set()
    assert [r.endpoint_id for r in runtime.core.warmup.take()] == ["pod2:8000"]


async def test_a_pool_removed_by_a_reload_leaves_no_warm_up_state(router_app):
    def pool(name: str, model: str) -> dict[str, object]:
        urls = [f"http://{name}{i}:8000" for i in range(2)]
        return {"name": name, "model": model, "endpoints": {"static": [{"url": u} for u in urls]}}

    client, runtime = await router_app(
        make_config(pools=[pool("p", "m"), pool("q", "m2")]), FakePods()
    )
    for i in range(3):
        assert (await client.post("/v1/completions", json=_body(i))).status_code == 200
    warmup, now = runtime.core.warmup, runtime.core.clock()
    warmup.peer_counts.update("default/p", {"r1": {b"k" * 32: 3.0}}, now)
    assert warmup.hot.has("default/p") and warmup.hot.bytes > 0
    await runtime.reload(make_config(pools=[pool("q", "m2")]))
    assert not warmup.hot.has("default/p") and warmup.hot.bytes == 0
    assert warmup.peer_counts.counts("default/p", now) == {}
    assert warmup.peer_counts.replicas("default/p", now) == 0
