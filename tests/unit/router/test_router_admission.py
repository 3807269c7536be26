"""Flow control: the fair queue's order, and the routing core's queue (saturation, priority,
fairness, deadlines, affinity, disconnects), driven with an injected clock."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from typing import Any

import pytest
from tests.unit.router.fakes import make_config, static_core

from kvgate.discovery.endpoints import LoadSample
from kvgate.router.core.admission import Waiter, _shared_blocks
from kvgate.router.core.errors import RouterError
from kvgate.router.core.fair_queue import FairQueue, Queued
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.routing import RoutePlan

TENANTS = {
    "tenants": [
        {"name": "flood", "api_keys": [{"value": "k-flood"}]},
        {"name": "short", "api_keys": [{"value": "k-short"}]},
        {"name": "vip", "api_keys": [{"value": "k-vip"}], "priority": 5},
    ]
}


# -- the fair queue ------------------------------------------------------------------------


def test_a_flow_of_huge_prompts_cannot_starve_a_flow_of_short_ones():
    queue: FairQueue[str] = FairQueue()
    for i in range(10):
        queue.push(f"flood{i}", "flood", band=0, cost=100_000, weight=1.0)
    for i in range(10):
        queue.push(f"short{i}", "short", band=0, cost=1_000, weight=1.0)
    order = [q.item for q in queue]
    # The first flood prompt started first; every short prompt leaves before the second one.
    assert order[0] == "flood0"
    assert order[1:11] == [f"short{i}" for i in range(10)]
    assert order[11:] == [f"flood{i}" for i in range(1, 10)]


def test_higher_bands_leave_first_and_weights_share_a_band():
    queue: FairQueue[str] = FairQueue()
    for i in range(4):
        queue.push(f"a{i}", "a", band=0, cost=100, weight=1.0)
        queue.push(f"b{i}", "b", band=0, cost=100, weight=3.0)
    top = queue.push("vip", "v", band=1, cost=10**9, weight=1.0)
    order = [q.item for q in queue]
    assert order[0] == "vip" and queue.position(top) == 0
    # b (weight 3) gets three prompts for each of a's.
    assert order[1:6] == ["a0", "b0", "b1", "b2", "a1"]


def test_an_idle_flow_comes_back_at_the_current_virtual_time():
    queue: FairQueue[str] = FairQueue()
    nodes = [queue.push(f"a{i}", "a", band=0, cost=100, weight=1.0) for i in range(5)]
    for node in nodes[:3]:
        assert queue.take(node)
    late = queue.push("b0", "b", band=0, cost=100, weight=1.0)
    # b arrives at the virtual time of the last served item: ahead of a's unserved backlog
    # only by its start tag (200 vs a3 at 300), not by a's whole past.
    assert [q.item for q in queue] == ["b0", "a3", "a4"]
    assert queue.remove(late) and not queue.remove(late)
    assert len(queue) == 2


def test_within_a_flow_the_most_urgent_leaves_first_and_the_flows_keep_their_shares():
    queue: FairQueue[str] = FairQueue()
    a = [queue.push(f"a{i}", "a", band=0, cost=100, weight=1.0, urgency=10.0 - i) for i in range(3)]
    for i in range(3):
        queue.push(f"b{i}", "b", band=0, cost=100, weight=1.0, urgency=float(i))
    assert [q.item for q in queue] == ["a2", "b0", "a1", "b1", "a0", "b2"]
    # A late urgent item takes its flow's first slot; the flow's others move one slot later,
    # and the other flow's items keep theirs.
    late = queue.push("a-late", "a", band=0, cost=100, weight=1.0, urgency=0.0)
    order = ["a-late", "b0", "a2", "b1", "a1", "b2", "a0"]
    assert [q.item for q in queue] == order
    assert queue.position(late) == 0 and queue.position(a[0]) == 6
    # One served out of turn gives up its own slot; put back, it takes it again.
    assert queue.take(a[1])
    assert [q.item for q in queue] == ["a-late", "b0", "a2", "b1", "b2", "a0"]
    queue.restore(a[1])
    assert [q.item for q in queue] == order
    assert queue.newest_of_largest_flow() is a[0] and queue.count(0, "a") == 4


def test_the_fair_queue_keeps_its_order_through_random_pushes_takes_and_restores():
    for seed in range(50):
        rng = random.Random(seed)
        queue: FairQueue[int] = FairQueue()
        queued: list[Queued[int]] = []
        served: list[Queued[int]] = []
        for step in range(150):
            op = rng.random()
            if op < 0.5 or not queued:
                queued.append(
                    queue.push(
                        step,
                        rng.choice("abc"),
                        band=rng.choice((0, 0, 1)),
                        cost=rng.choice((1, 100, 5000)),
                        weight=rng.choice((1.0, 2.0)),
                        urgency=rng.uniform(0, 10),
                    )
                )
            elif op < 0.8:
                node = queued.pop(rng.randrange(len(queued)))
                assert queue.take(node) and not queue.take(node)
                served.append(node)
            elif op < 0.9:
                assert queue.remove(queued.pop(rng.randrange(len(queued))))
            elif served:
                node = served.pop(rng.randrange(len(served)))
                queue.restore(node)
                queued.append(node)
            order = list(queue)
            assert sorted(q.item for q in order) == sorted(q.item for q in queued)
            assert all(queue.position(q) == i for i, q in enumerate(order))
            # Higher bands first; within a band and flow, by urgency.
            assert [-q.band for q in order] == sorted(-q.band for q in order)
            for flow in "abc":
                for band in (0, 1):
                    mine = [q.rank_key for q in order if q.flow == flow and q.band == band]
                    assert mine == sorted(mine) and len(mine) == queue.count(band, flow)


# -- the routing core's queue ------------------------------------------------------------------


async def _core(
    n: int = 1, flow: dict[str, Any] | None = None, pools: list[dict[str, Any]] | None = None
) -> tuple[RoutingCore, list[float]]:
    """A core on the clock `now[0]` over `n` pods pod<i>:8000 of one online pool, or over the
    static endpoints of `pools`."""
    now = [100.0]
    config = make_config(
        n,
        tenants=TENANTS,
        flow_control={"max_waiting_requests": 1, **(flow or {})},
        **({"pools": pools} if pools else {}),
    )
    core = await static_core(config, now)
    return core, now


def _request(
    tokens: int = 64, tenant: str = "short", first: int = 0, **headers: str
) -> ClientRequest:
    body = {"model": "m", "prompt": list(range(first, first + tokens)), "max_tokens": 4}
    return ClientRequest(
        body, {"authorization": f"Bearer k-{tenant}", **headers}, "completion", body_bytes=100
    )


def _set_limits(core: RoutingCore, **limits: Any) -> None:
    """Change flow-control settings in place, as a reload would."""
    config = core.state.config
    flow = config.flow_control.model_copy(update=limits)
    core.flow.configure(config.model_copy(update={"flow_control": flow}))


class Grants:
    """Collects `on_done` calls, in order."""

    def __init__(self) -> None:
        self.done: list[Waiter] = []

    def __call__(self, waiter: Waiter) -> None:
        self.done.append(waiter)

    def names(self) -> list[str]:
        return [w.request.request_id for w in self.done]


async def _send(core: RoutingCore, request: ClientRequest, grants: Grants) -> Any:
    """Admit; a plan is sent at once (streaming). Returns (plan, attempt) or the waiter."""
    admitted = await core.admit(request, grants)
    if isinstance(admitted, RoutePlan):
        return admitted, core.sent(request, admitted, streaming=True)
    return admitted


async def test_a_request_waits_while_the_pod_is_saturated_and_goes_when_it_has_room():
    core, _now = await _core()
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    waiter = await _send(core, _request(), grants)
    assert isinstance(waiter, Waiter) and len(core.flow) == 1 and grants.done == []
    core.first_byte(plan, attempt, streamed=True)  # its prefill is over: room for one more
    assert grants.done == [waiter] and waiter.error is None and len(core.flow) == 0
    granted = await core.dispatch(waiter)
    assert granted.endpoint.id == "pod0:8000"
    assert core.flow.saturation.reserved == {}  # the slot it held is released once planned


async def test_the_scraped_engine_queue_saturates_a_pod_too():
    core, now = await _core(flow={"max_waiting_requests": 3})
    ep = core.endpoints.all()[0]
    core.load_scraped(ep, LoadSample(waiting=3, running=10, kv_cache_usage=0.1, scraped_at=now[0]))
    assert isinstance(await core.admit(_request(), Grants()), Waiter)
    core.load_scraped(ep, LoadSample(waiting=0, running=10, kv_cache_usage=0.96, scraped_at=now[0]))
    assert core.flow.slots(ep, now[0], fail_open=False) == 0  # KV cache 96% full (limit 95%)
    grants = Grants()
    second = await core.admit(_request(), grants)
    core.load_scraped(ep, LoadSample(waiting=0, running=10, kv_cache_usage=0.5, scraped_at=now[0]))
    assert len(core.flow) == 0 and second in grants.done


async def test_a_kv_cache_limit_of_1_counts_no_pod_full():
    core, now = await _core(flow={"max_waiting_requests": 3, "max_kv_cache_usage": 1.0})
    ep = core.endpoints.all()[0]
    core.load_scraped(ep, LoadSample(waiting=0, running=10, kv_cache_usage=1.0, scraped_at=now[0]))
    assert core.flow.slots(ep, now[0], fail_open=False) == 3  # every block in use: not full


async def test_with_every_pod_ejected_flow_control_fails_open_as_routing_does():
    """Pods whose /metrics all fail (or answer slower than the scrape timeout) are all ejected,
    yet they may serve: routing fails open, and flow control gave such pods no room, so every
    request waited out its deadline (30 s) and got a 429 as if rate-limited."""
    core, now = await _core(2)
    limits = core.state.config.limits
    pods = core.endpoints.all()
    for pod in pods:
        for _ in range(limits.eject_after_failures):
            core.scrape_failed(pod, TimeoutError())
    assert not any(pod.healthy(now[0]) for pod in pods)
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    second, _ = await _send(core, _request(first=1000), grants)
    assert {plan.endpoint.id, second.endpoint.id} == {pod.id for pod in pods}
    waiter = await _send(core, _request(first=2000), grants)  # both full: it waits
    assert isinstance(waiter, Waiter)
    core.first_byte(plan, attempt, streamed=True)  # room again: granted on the ejected pod
    assert grants.done == [waiter] and waiter.error is None
    assert (await core.dispatch(waiter)).endpoint.id == plan.endpoint.id
    # One pod back: the other is out of rotation again.
    core.load_scraped(pods[0], LoadSample(scraped_at=now[0]))
    assert core.flow.slots(pods[1], now[0], fail_open=False) == 0


async def test_online_leaves_before_batch_and_priority_tenants_first():
    core, _now = await _core()
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    for name, tenant, cls in (
        ("batch", "short", "batch"),
        ("online", "short", "online"),
        ("vip", "vip", "online"),
    ):
        request = _request(tenant=tenant, **{"x-kvgate-class": cls})
        request.request_id = name
        assert isinstance(await core.admit(request, grants), Waiter)
    # Fresh load that lets batch borrow the online pod (unknown load never does).
    ep = plan.endpoint
    core.load_scraped(ep, LoadSample(waiting=0, running=1, kv_cache_usage=0.1, scraped_at=100.0))
    assert grants.done == []  # still saturated: its one request is in its prefill
    _set_limits(core, max_waiting_requests=3)
    core.first_byte(plan, attempt, streamed=True)
    # three slots now: the vip first, then online, then batch
    assert grants.names() == ["vip", "online", "batch"]


async def test_short_prompts_of_one_tenant_pass_a_flood_of_long_ones():
    core, _now = await _core(flow={"max_pending_prefill_tokens": 10**6})
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    for i in range(4):
        request = _request(4096, tenant="flood")
        request.request_id = f"flood{i}"
        await core.admit(request, grants)
    for i in range(4):
        request = _request(64, tenant="short")
        request.request_id = f"short{i}"
        await core.admit(request, grants)
    order = await _drain(core, plan, attempt, grants)
    assert order[0] == "flood0"
    assert order[1:5] == ["short0", "short1", "short2", "short3"]
    assert order[5:] == ["flood1", "flood2", "flood3"]


async def _queue_order(flow: dict[str, Any], arrivals: list[tuple[str, float, int]]) -> list[str]:
    """Saturate the one pod, queue (name, arrival time, prompt tokens) of one tenant, then free
    the pod one request at a time: the order in which the waiters left."""
    core, now = await _core(flow={"max_pending_prefill_tokens": 10**6, **flow})
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    for i, (name, at, tokens) in enumerate(arrivals):
        now[0] = at
        request = _request(tokens, first=(i + 1) * 100_000)  # no prefix shared
        request.request_id = name
        assert isinstance(await core.admit(request, grants), Waiter)
    return await _drain(core, plan, attempt, grants)


async def _drain(core: RoutingCore, plan: RoutePlan, attempt: Any, grants: Grants) -> list[str]:
    """End the prefill of the request holding the pod, then send each granted waiter and end its
    prefill in turn: the order in which the waiters left."""
    order = []
    core.first_byte(plan, attempt, streamed=True)
    while grants.done:
        waiter = grants.done.pop(0)
        order.append(waiter.request.request_id)
        granted = await core.dispatch(waiter)
        core.first_byte(granted, core.sent(waiter.request, granted, streaming=True), streamed=True)
    return order


async def test_a_short_prompt_passes_a_long_one_of_its_tenant_that_arrived_just_before_it():
    # The unmeasured pod prefills at the cost model's prior, 10k tokens/s: the long prompt's
    # prefill is predicted at 0.8 s, so a short one arriving within 0.8 s of it leaves first,
    # one arriving later does not.
    arrivals = [("long", 100.0, 8_000), ("soon", 100.5, 64), ("later", 101.0, 64)]
    assert await _queue_order({}, arrivals) == ["soon", "long", "later"]
    assert await _queue_order({"prefill_time_weight": 0}, arrivals) == ["long", "soon", "later"]


async def test_an_unknown_or_endless_prefill_prediction_cannot_disorder_the_queue():
    core, now = await _core()
    grants = Grants()
    await _send(core, _request(), grants)
    for i, prefill in enumerate((math.nan, math.inf, -1.0, 0.5, 1000.0)):
        request = _request(first=(i + 1) * 1000)
        request.request_id = str(prefill)
        cls = core.state.classifier.classify(request.body, request.headers)
        core.flow.enqueue(
            request,
            cls,
            prompt_tokens=64,
            hits={},
            hold_seconds=0.0,
            prefill_seconds=prefill,
            on_done=grants,
        )
        now[0] += 0.1
    (queue,) = core.flow._queues.values()
    order = [node.item.request.request_id for node in queue.fair]
    assert order == ["nan", "inf", "-1.0", "0.5", "1000.0"]
    # 1,000 s of prefill counts as the online deadline (30 s), no more.
    assert [node.urgency for node in queue.fair] == pytest.approx([100, 100.1, 100.2, 100.8, 130.4])


async def test_a_request_that_cannot_start_by_its_deadline_gets_429_with_retry_after():
    core, now = await _core()
    grants = Grants()
    await _send(core, _request(), grants)
    waiter = await core.admit(_request(**{"x-kvgate-deadline-ms": "500"}), grants)
    assert isinstance(waiter, Waiter)
    now[0] += 0.4
    core.flow.pump()
    assert grants.done == []
    now[0] += 0.2
    core.flow.pump()
    assert grants.done == [waiter]
    error = waiter.error
    assert error is not None and error.status == 429 and error.code == "deadline_exceeded"
    assert error.body()["error"]["type"] == "rate_limit_error"
    assert (b"retry-after", b"1") in error.headers()
    assert len(core.flow) == 0 and core.flow._bytes == 0


async def test_a_deadline_the_queue_rate_cannot_meet_is_refused_at_once():
    core, now = await _core(flow={"max_pending_prefill_tokens": 10**6})
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    for _ in range(20):  # one dispatch every 0.5 s: the queue's measured rate is 2/s
        await core.admit(_request(), grants)
    for _ in range(10):
        now[0] += 0.5
        core.first_byte(plan, attempt, streamed=True)
        waiter = grants.done.pop(0)
        plan = await core.dispatch(waiter)
        attempt = core.sent(waiter.request, plan, streaming=True)
    # 10 wait, at 2/s: 5.5 s ahead of a new one; a 2 s deadline cannot be met.
    with pytest.raises(RouterError) as refused:
        await core.admit(_request(**{"x-kvgate-deadline-ms": "2000"}), grants)
    assert refused.value.status == 429 and refused.value.code == "deadline_exceeded"
    assert refused.value.retry_after_seconds == pytest.approx(5.5)
    assert len(core.flow) == 10


async def test_the_queue_rate_is_measured_per_backlog_not_across_an_idle_gap():
    core, now = await _core(flow={"max_pending_prefill_tokens": 10**6})
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)

    async def grant_one() -> None:
        nonlocal plan, attempt
        now[0] += 0.5
        core.first_byte(plan, attempt, streamed=True)
        waiter = grants.done.pop(0)
        plan = await core.dispatch(waiter)
        attempt = core.sent(waiter.request, plan, streaming=True)

    for _ in range(10):
        await core.admit(_request(), grants)
    for _ in range(10):  # a backlog drained at 2/s
        await grant_one()
    assert len(core.flow) == 0
    now[0] += 60.0  # a minute with nothing queued; the pod is still busy with the last one
    for _ in range(3):
        await core.admit(_request(), grants)
    await grant_one()
    # 2 wait. Measured across the idle minute (10 grants over 65 s) the rate would put a new
    # request 19 s out and refuse its 5 s deadline; this backlog has no rate yet.
    await core.admit(_request(**{"x-kvgate-deadline-ms": "5000"}), grants)
    assert len(core.flow) == 3


async def test_bad_deadline_headers_are_400_and_long_ones_are_capped():
    core, _now = await _core(flow={"max_deadline_seconds": 60.0, "batch_max_wait_seconds": 60.0})
    await _send(core, _request(), Grants())
    for bad in ("-1", "0", "1.5", "soon", "9" * 40):
        with pytest.raises(RouterError) as refused:
            await core.admit(_request(**{"x-kvgate-deadline-ms": bad}), Grants())
        assert refused.value.status == 400 and refused.value.code == "invalid_deadline"
    waiter = await core.admit(_request(**{"x-kvgate-deadline-ms": "99999999"}), Grants())
    assert isinstance(waiter, Waiter)
    assert waiter.deadline_at - waiter.enqueued_at == 60.0


async def test_the_queue_is_bounded_in_requests_and_bytes():
    core, _now = await _core(flow={"max_queued_requests": 2, "max_queued_bytes": 10_000})
    await _send(core, _request(), Grants())
    for _ in range(2):
        await core.admit(_request(), Grants())
    with pytest.raises(RouterError) as full:
        await core.admit(_request(), Grants())
    assert full.value.status == 429 and full.value.code == "queue_full"
    assert full.value.retry_after_seconds is not None
    _set_limits(core, max_queued_requests=100)
    big = _request()
    big.body_bytes = 9_900
    with pytest.raises(RouterError):
        await core.admit(big, Grants())
    assert len(core.flow) == 2


async def test_a_queued_request_waits_for_its_prefix_holder_while_that_is_cheaper():
    core, now = await _core(2, flow={"max_pending_prefill_tokens": 10**6})
    index = next(iter(core.router.indexes.values()))
    # 8192 cached tokens at the 10k tokens/s prior: 0.82 s saved, so it may wait twice that
    # (the miss costs its own prefill and as much to the requests queued behind the recompute)
    prompt = _request(8192)
    keys = (await core.explain(prompt)).keys.block_keys
    await index.add_approximate("pod1:8000", keys, 300.0)
    grants = Grants()
    busy = {}
    for first in (50_000, 60_000):  # saturate both pods
        plan, attempt = await _send(core, _request(16, first=first), grants)
        busy[plan.endpoint.id] = (plan, attempt)
    assert set(busy) == {"pod0:8000", "pod1:8000"}
    waiter = await core.admit(prompt, grants)
    assert isinstance(waiter, Waiter) and waiter.holder == "pod1:8000"
    core.first_byte(*busy["pod0:8000"], streamed=True)  # the other pod frees up first
    assert grants.done == []  # waiting for the holder costs less than recomputing 8192 tokens
    now[0] += 1.2  # past the prefill the hit saves, not yet past twice that
    core.flow.pump()
    assert grants.done == []
    now[0] += 0.5  # past twice the prefill the hit saves: recomputing is cheaper now
    core.flow.pump()
    assert grants.done == [waiter] and waiter.granted_to == "pod0:8000"
    assert (await core.dispatch(waiter)).endpoint.id == "pod0:8000"


async def _both_pods_busy_and_a_prompt_held_on_pod1() -> tuple[
    RoutingCore, ClientRequest, Grants, dict[str, Any]
]:
    """Two pods, each saturated by one request in its prefill; an 8192-token prompt whose
    blocks pod1 holds (routing history). Returns (core, prompt, grants, plan+attempt by pod)."""
    core, _now = await _core(2, flow={"max_pending_prefill_tokens": 10**6})
    index = next(iter(core.router.indexes.values()))
    prompt = _request(8192)
    keys = (await core.explain(prompt)).keys.block_keys
    await index.add_approximate("pod1:8000", keys, 300.0)
    grants = Grants()
    busy = {}
    for first in (50_000, 60_000):
        plan, attempt = await _send(core, _request(16, first=first), grants)
        busy[plan.endpoint.id] = (plan, attempt)
    assert set(busy) == {"pod0:8000", "pod1:8000"}
    return core, prompt, grants, busy


async def test_a_queued_request_goes_to_its_prefix_holder_when_that_frees_up_first():
    core, prompt, grants, busy = await _both_pods_busy_and_a_prompt_held_on_pod1()
    waiter = await core.admit(prompt, grants)
    core.first_byte(*busy["pod1:8000"], streamed=True)
    assert grants.done == [waiter] and waiter.granted_to == "pod1:8000"
    granted = await core.dispatch(waiter)
    assert granted.endpoint.id == "pod1:8000" and granted.decision.predicted_hit_tokens > 0


async def test_a_slot_on_a_prefix_holder_goes_to_the_waiter_that_hits_there_before_the_head():
    """Past capacity every request waits; the head of the queue holds nothing anywhere. When
    the holder of a later waiter's prefix frees up, the later waiter gets it (the head would
    recompute there what it could compute anywhere), and the head takes the next slot."""
    core, prompt, grants, busy = await _both_pods_busy_and_a_prompt_held_on_pod1()
    prompt.request_id = "hits-on-pod1"
    head = _request(512, first=90_000)
    head.request_id = "cold-head"
    assert isinstance(await core.admit(head, grants), Waiter)
    assert isinstance(await core.admit(prompt, grants), Waiter)
    core.first_byte(*busy["pod1:8000"], streamed=True)
    assert grants.names() == ["hits-on-pod1"]
    assert grants.done[0].granted_to == "pod1:8000"
    core.first_byte(*busy["pod0:8000"], streamed=True)
    assert grants.names() == ["hits-on-pod1", "cold-head"]


async def test_queued_requests_on_one_new_prefix_wait_for_the_pod_the_first_is_granted():
    """Past capacity a burst on a new prefix queues before any pod holds it. Once the first of
    it is granted a pod, the others wait for that pod (it computes the prefix there) instead of
    recomputing it wherever a slot opens next."""
    core, now = await _core(2, flow={"max_pending_prefill_tokens": 10**6})
    grants = Grants()
    busy = {}
    for first in (50_000, 60_000):
        plan, attempt = await _send(core, _request(16, first=first), grants)
        busy[plan.endpoint.id] = (plan, attempt)
    lead, follower = _request(8192), _request(8192 + 512)  # the follower extends the lead
    lead.request_id, follower.request_id = "lead", "follower"
    for request in (lead, follower):
        waiter = await core.admit(request, grants)
        assert isinstance(waiter, Waiter) and waiter.holder is None
    now[0] += 1.0
    core.first_byte(*busy["pod0:8000"], streamed=True)
    assert grants.names() == ["lead"] and grants.done[0].granted_to == "pod0:8000"
    (queued,) = (node.item for queue in core.flow._queues.values() for node in queue.fair)
    assert queued.holder == "pod0:8000" and queued.hits["pod0:8000"] == 8192
    lead_plan = await core.dispatch(grants.done[0])
    assert lead_plan.endpoint.id == "pod0:8000"
    lead_attempt = core.sent(lead, lead_plan, streaming=True)
    now[0] += 1.0  # it may wait for pod0 1.64 s from the grant (8192 tokens at 10k/s, x 2)
    core.first_byte(*busy["pod1:8000"], streamed=True)
    assert grants.names() == ["lead"]  # pod1 has room, but would recompute the lead's prefix
    core.first_byte(lead_plan, lead_attempt, streamed=True)
    assert grants.names() == ["lead", "follower"] and grants.done[1].granted_to == "pod0:8000"
    planned = await core.dispatch(grants.done[1])
    assert planned.endpoint.id == "pod0:8000" and planned.decision.predicted_hit_tokens >= 8192


async def test_one_dispatch_grants_a_pod_no_more_prefill_than_the_token_limit():
    """A pod that frees up is granted a long cold prompt; the short prompt queued behind it
    is not granted the same pod in that dispatch (it would wait there for the long prefill):
    the long one's tokens are reserved with its slot, and the short one takes the next pod."""
    core, now = await _core(2, flow={"max_waiting_requests": 3, "max_pending_prefill_tokens": 2048})
    grants = Grants()
    busy = {}
    for first in (50_000, 60_000):  # each pod saturated by one prompt over the token limit
        plan, attempt = await _send(core, _request(4096, first=first), grants)
        busy[plan.endpoint.id] = (plan, attempt)
    assert set(busy) == {"pod0:8000", "pod1:8000"}
    long, short = _request(8192, first=100_000), _request(64, first=200_000)
    long.request_id, short.request_id = "long", "short"
    assert isinstance(await core.admit(long, grants), Waiter)
    now[0] += 2.0  # the long one arrived more than its prefill before: it stays ahead
    assert isinstance(await core.admit(short, grants), Waiter)
    core.first_byte(*busy["pod0:8000"], streamed=True)  # pod0 has three free slots
    assert grants.names() == ["long"] and grants.done[0].granted_to == "pod0:8000"
    assert core.flow.saturation.reserved == {"pod0:8000": 1}
    core.first_byte(*busy["pod1:8000"], streamed=True)
    assert grants.names() == ["long", "short"] and grants.done[1].granted_to == "pod1:8000"
    for waiter, pod in zip(grants.done, ("pod0:8000", "pod1:8000"), strict=True):
        assert (await core.dispatch(waiter)).endpoint.id == pod
    assert core.flow.saturation.reserved == {}


def test_shared_blocks_are_found_by_bisection_over_chained_keys():
    def chain(tokens: list[int]) -> list[bytes]:
        keys, parent = [], b""
        for token in tokens:
            parent = hashlib.blake2b(parent + bytes([token]), digest_size=8).digest()
            keys.append(parent)
        return keys

    base = list(range(200))
    for cut in (0, 1, 57, 199):
        assert _shared_blocks(chain(base), chain([*base[:cut], 255, *base[cut + 1 :]])) == cut
    assert _shared_blocks(chain(base), chain(base[:120])) == 120
    assert _shared_blocks(chain(base), []) == 0


async def test_a_client_that_leaves_while_queued_is_removed_and_leaks_nothing():
    core, _now = await _core()
    plan, attempt = await _send(core, _request(), Grants())
    task = asyncio.create_task(core.route(_request()))
    await asyncio.sleep(0)
    assert len(core.flow) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(core.flow) == 0 and core.flow._bytes == 0 and core.flow.saturation.reserved == {}
    core.first_byte(plan, attempt, streamed=True)  # nothing left to grant
    live = asyncio.create_task(core.route(_request()))
    routed = await asyncio.wait_for(live, 1.0)  # room now: planned at once
    assert routed.endpoint.id == "pod0:8000"


async def test_route_waits_for_the_grant_and_answers_the_deadline():
    core, _now = await _core()
    plan, attempt = await _send(core, _request(), Grants())
    waiting = asyncio.create_task(core.route(_request()))
    await asyncio.sleep(0)
    core.first_byte(plan, attempt, streamed=True)
    assert (await asyncio.wait_for(waiting, 1.0)).endpoint.id == "pod0:8000"
    # The pod is saturated again (the request just planned was never sent, so send one).
    core.sent(_request(), plan, streaming=True)
    with pytest.raises(RouterError) as late:
        await core.route(_request(**{"x-kvgate-deadline-ms": "20"}))
    assert late.value.status == 429 and late.value.code == "deadline_exceeded"


async def test_batch_requests_no_pod_may_take_wait_instead_of_503():
    core, now = await _core(flow={"max_waiting_requests": 5})
    ep = core.endpoints.all()[0]
    # The only pool is online and its pod is queueing: batch may not borrow it.
    core.load_scraped(ep, LoadSample(waiting=2, running=4, kv_cache_usage=0.1, scraped_at=now[0]))
    grants = Grants()
    waiter = await core.admit(_request(**{"x-kvgate-class": "batch"}), grants)
    assert isinstance(waiter, Waiter) and waiter.holder is None
    core.load_scraped(ep, LoadSample(waiting=0, running=4, kv_cache_usage=0.1, scraped_at=now[0]))
    assert grants.done == [waiter]
    assert (await core.dispatch(waiter)).endpoint.id == ep.id


async def test_online_decisions_see_the_batch_requests_waiting_to_borrow_their_pool():
    # class-isolation yields an online pod to them (docs/scoring.md); /debug/route shows them.
    core, now = await _core(flow={"max_waiting_requests": 5})
    ep = core.endpoints.all()[0]
    core.load_scraped(ep, LoadSample(waiting=2, running=4, kv_cache_usage=0.1, scraped_at=now[0]))
    grants = Grants()
    for _ in range(2):
        assert isinstance(await core.admit(_request(**{"x-kvgate-class": "batch"}), grants), Waiter)
    assert core.flow.batch_waiting(ep.spec.pool) == 2
    online = await core.admit(_request(), grants)
    assert isinstance(online, RoutePlan) and online.decision.to_dict()["batch_waiting"] == 2
    core.load_scraped(ep, LoadSample(waiting=0, running=4, kv_cache_usage=0.1, scraped_at=now[0]))
    assert len(grants.done) == 2 and core.flow.batch_waiting(ep.spec.pool) == 0
    batch = await core.dispatch(grants.done[0])
    assert batch.decision.to_dict()["batch_waiting"] == 0  # counted for online requests only


async def test_batch_requests_with_a_batch_pool_wait_for_it_not_for_online_room():
    online = {"name": "on", "model": "m", "endpoints": {"static": [{"url": "http://on0:8000"}]}}
    batch_pod = {"static": [{"url": "http://off0:8000"}]}
    batch_pool = {"name": "off", "model": "m", "pool_class": "batch", "endpoints": batch_pod}
    core, _now = await _core(pools=[online, batch_pool])
    grants = Grants()
    batch = {"x-kvgate-class": "batch"}
    plan, _attempt = await _send(core, _request(**batch), grants)
    assert plan.endpoint.id == "off0:8000"
    # The batch pod is saturated and the online pod's load unknown (not borrowable): it waits,
    # for its own pool; online decisions are not asked to make room for it.
    assert isinstance(await core.admit(_request(**batch), grants), Waiter)
    assert len(core.flow) == 1 and core.flow.batch_waiting(core.state.config.pools[0].key) == 0


async def test_without_flow_control_saturation_changes_nothing():
    core, _now = await _core(flow={"enabled": False})
    grants = Grants()
    for _ in range(5):
        assert isinstance((await _send(core, _request(), grants))[0], RoutePlan)


async def test_a_full_queue_makes_the_tenant_holding_most_of_it_give_way():
    core, _now = await _core(flow={"max_queued_requests": 4})
    await _send(core, _request(), Grants())
    grants = Grants()
    flood = []
    for i in range(4):
        request = _request(tenant="flood")
        request.request_id = f"flood{i}"
        flood.append(await core.admit(request, grants))
    # The flood filled the queue; a short request still gets in: the flood's newest leaves.
    short = await core.admit(_request(tenant="short"), grants)
    assert isinstance(short, Waiter) and len(core.flow) == 4
    assert grants.names() == ["flood3"]
    error = grants.done[0].error
    assert error is not None and error.status == 429 and error.code == "queue_full"
    # Two each now: a third short one would hold more than the flood, so it is refused.
    await core.admit(_request(tenant="short"), grants)
    assert grants.names() == ["flood3", "flood2"]
    with pytest.raises(RouterError) as full:
        await core.admit(_request(tenant="short"), grants)
    assert full.value.code == "queue_full"
    # A higher-priority tenant pushes out lower bands whatever their size.
    await core.admit(_request(tenant="vip"), grants)
    assert len(grants.done) == 3 and len(core.flow) == 4


async def test_a_newcomer_the_queue_cannot_take_pushes_no_one_out():
    core, now = await _core()
    grants = Grants()
    current = await _send(core, _request(), grants)
    for i in range(14):
        request = _request(tenant="flood", first=1000 * (i + 1))
        assert isinstance(await core.admit(request, grants), Waiter)
    for _ in range(10):  # served one a second
        now[0] += 1.0
        core.first_byte(*current, streamed=True)
        waiter = grants.done.pop(0)
        plan = await core.dispatch(waiter)
        current = (plan, core.sent(waiter.request, plan, streaming=True))
    _set_limits(core, max_queued_requests=4)
    # Full: a newcomer whose deadline the queue cannot meet is refused alone.
    hurried = _request(tenant="other", first=999_000, **{"x-kvgate-deadline-ms": "500"})
    with pytest.raises(RouterError) as late:
        await core.admit(hurried, grants)
    assert late.value.code == "deadline_exceeded"
    assert grants.done == [] and len(core.flow) == 4
    # Too big to fit even once the flood gave way as far as it must: refused alone too.
    _set_limits(core, max_queued_requests=4, max_queued_bytes=500)
    big = _request(tenant="other", first=99_999)
    big.body_bytes = 950
    with pytest.raises(RouterError) as full:
        await core.admit(big, grants)
    assert full.value.code == "queue_full"
    assert grants.done == [] and len(core.flow) == 4 and core.flow._bytes == 400
    # One that fits and can wait gets in: the flood's newest gives way.
    assert isinstance(await core.admit(_request(tenant="other", first=500_000), grants), Waiter)
    assert [w.error.code for w in grants.done if w.error] == ["queue_full"]
    assert len(core.flow) == 4


async def test_a_flooding_tenant_keeps_to_its_share_of_the_pods_while_another_is_active():
    core, now = await _core(4, flow={"max_waiting_requests": 5})
    grants = Grants()
    # Alone, the flood may prefill everywhere.
    sent = [
        await _send(core, _request(4096, tenant="flood", first=i * 10_000), grants)
        for i in range(4)
    ]
    assert len({plan.endpoint.id for plan, _attempt in sent}) == 4
    for plan, attempt in sent:  # they end
        core.cancelled(plan, attempt)
    # Another tenant is active: the flood's new requests stay on half of the pods...
    await _send(core, _request(64, tenant="short", first=90_000), grants)
    now[0] += 0.01
    flood_pods = set()
    for i in range(6):
        admitted = await _send(core, _request(1024, tenant="flood", first=(i + 5) * 10_000), grants)
        if isinstance(admitted, tuple):
            flood_pods.add(admitted[0].endpoint.id)
    assert len(flood_pods) == 2
    # ...so the short tenant's next prompt finds a pod with no flood prefill.
    plan, _attempt = await _send(core, _request(64, tenant="short", first=95_000), grants)
    assert plan.endpoint.id not in flood_pods
    # Once the other tenant has been quiet for the window, the limit is gone.
    now[0] += core.flow.config.fair_share_window_seconds + 1
    admitted = await _send(core, _request(1024, tenant="flood", first=200_000), grants)
    assert isinstance(admitted, tuple)


async def test_a_waiter_put_back_keeps_its_place_and_its_deadline():
    core, now = await _core()
    grants = Grants()
    plan, attempt = await _send(core, _request(), grants)
    first = await core.admit(_request(**{"x-kvgate-deadline-ms": "1000"}), grants)
    second = await core.admit(_request(), grants)
    core.first_byte(plan, attempt, streamed=True)
    assert grants.done == [first]
    core.flow.requeue(first)  # its pod went away between the grant and its plan
    assert len(core.flow) == 2 and core.flow.saturation.reserved == {}
    assert [q.item for q in core.flow._queues[first.key].fair] == [first, second]
    now[0] += 1.5
    core.flow.pump()
    assert first.error is not None and first.error.code == "deadline_exceeded"
    assert grants.done[1:] == [first, second]  # expired, then the next one granted
    assert second.error is None and len(core.flow) == 0


async def test_a_responses_follow_up_waits_for_its_pod_alone_and_others_pass_it():
    """A follow-up pinned to pod0 queues apart: when pod1 frees up, the other waiter goes there
    and the follow-up keeps waiting for pod0; once pod0 leaves, it is a 404."""
    from kvgate.router.core.response_ids import mint

    core, _now = await _core(2)
    grants = Grants()
    sent = [await _send(core, _request(first=i * 1000), grants) for i in range(2)]
    assert {plan.endpoint.id for plan, _ in sent} == {"pod0:8000", "pod1:8000"}
    headers = {"authorization": "Bearer k-short"}
    scope = core.state.classifier.caller_scope(headers)  # the tenant's ids
    body = {"model": "m", "input": "next", "previous_response_id": mint("pod0:8000", scope)}
    pinned = await core.admit(ClientRequest(body, headers, "responses", body_bytes=50), grants)
    other = await _send(core, _request(first=5000), grants)
    assert isinstance(pinned, Waiter) and isinstance(other, Waiter)
    on_pod1 = next((plan, attempt) for plan, attempt in sent if plan.endpoint.id == "pod1:8000")
    core.first_byte(*on_pod1, streamed=True)
    assert grants.done == [other]
    assert (await core.dispatch(other)).endpoint.id == "pod1:8000"
    on_pod0 = next((plan, attempt) for plan, attempt in sent if plan.endpoint.id == "pod0:8000")
    core.first_byte(*on_pod0, streamed=True)
    assert grants.done == [other, pinned]
    assert (await core.dispatch(pinned)).endpoint.id == "pod0:8000"
    # one queue per pod a follow-up waited for: not kept once empty (they were kept for good)
    assert [key for key in core.flow._queues if key[-1] is not None] == []
    gone = {**body, "previous_response_id": mint("pod9:8000", scope)}
    with pytest.raises(RouterError) as err:
        await core.admit(ClientRequest(gone, headers, "responses", body_bytes=50), grants)
    assert err.value.status == 404


async def test_a_follow_up_that_pushes_out_the_last_of_its_pods_queue_is_still_queued():
    """A pinned queue goes once empty: a newcomer that emptied it by pushing its only waiter
    out was put in the queue that was gone, never granted, and its bytes never given back."""
    from kvgate.router.core.response_ids import mint

    core, now = await _core(1, flow={"max_queued_bytes": 120})
    grants = Grants()
    await _send(core, _request(), grants)  # pod0 busy

    def follow_up(tenant: str) -> ClientRequest:
        headers = {"authorization": f"Bearer k-{tenant}"}
        scope = core.state.classifier.caller_scope(headers)
        body = {"model": "m", "input": "next", "previous_response_id": mint("pod0:8000", scope)}
        return ClientRequest(body, headers, "responses", body_bytes=50)

    low = await core.admit(follow_up("short"), grants)
    flood = ClientRequest(
        _request().body, {"authorization": "Bearer k-flood"}, "completion", body_bytes=60
    )
    other = await core.admit(flood, grants)
    vip = await core.admit(follow_up("vip"), grants)  # room for it: `low` goes
    assert isinstance(low, Waiter) and low.error is not None
    assert isinstance(vip, Waiter) and isinstance(other, Waiter)
    assert vip.node in core.flow._queues[vip.key].fair  # where the pump looks
    now[0] += 3600  # every waiter's deadline passed: each leaves, its bytes with it
    core.flow.pump()
    assert vip.error is not None and core.flow._bytes == 0 and len(core.flow) == 0


async def test_a_responses_follow_up_reaches_its_pod_while_it_drains():
    from kvgate.router.core.response_ids import mint

    core, _now = await _core(2, flow={"max_waiting_requests": 8})
    headers = {"authorization": "Bearer k-short"}
    scope = core.state.classifier.caller_scope(headers)
    core.endpoints.get("pod0:8000").draining = True  # type: ignore[union-attr]
    body = {"model": "m", "input": "next", "previous_response_id": mint("pod0:8000", scope)}
    plan = await core.admit(ClientRequest(body, headers, "responses", body_bytes=50), Grants())
    assert isinstance(plan, RoutePlan) and plan.endpoint.id == "pod0:8000"
    other = await core.admit(_request(), Grants())
    assert isinstance(other, RoutePlan) and other.endpoint.id == "pod1:8000"


async def test_queued_follow_ups_go_once_their_pod_begins_to_drain():
    from kvgate.router.core.response_ids import mint

    core, _now = await _core(1)
    grants = Grants()
    await _send(core, _request(), grants)  # the pod is saturated
    headers = {"authorization": "Bearer k-short"}
    scope = core.state.classifier.caller_scope(headers)
    body = {"model": "m", "input": "next", "previous_response_id": mint("pod0:8000", scope)}
    waiters = [
        await core.admit(ClientRequest(body, headers, "responses", body_bytes=50), grants)
        for _ in range(3)
    ]
    assert all(isinstance(w, Waiter) for w in waiters) and grants.done == []
    core.endpoints.get("pod0:8000").draining = True  # type: ignore[union-attr]
    core.flow.pump()  # all of them at once (the draining pod counted no slot after the first)
    assert grants.done == waiters and all(w.error is None for w in waiters)
    for waiter in waiters:
        assert (await core.dispatch(waiter)).endpoint.id == "pod0:8000"


def test_a_tenants_share_ends_attempts_of_no_uncached_token_after_its_sum_reached_zero():
    """An attempt with 0 uncached tokens ending after the tenant's token sum went to 0 raised
    KeyError in `_close`, and the flow-control pump after it never ran."""
    from kvgate.router.core.tenant_shares import TenantShares

    shares = TenantShares()
    shares.configure(10.0, {"a": 1.0})
    first, empty = object(), object()
    shares.started(first, "a", "pod0", 5)
    shares.started(empty, "a", "pod0", 0)
    shares.ended(first)
    shares.ended(empty)
    shares.ended(empty)  # idempotent
    assert shares._tokens == {} and shares._pods == {}
