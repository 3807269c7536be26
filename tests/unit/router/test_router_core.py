"""The routing core's hooks and endpoint accounting, driven directly with an injected clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.router.fakes import make_config, routing_core, static_core

from kvgate.discovery.endpoints import EndpointSpec, LoadSample
from kvgate.router.core.accounting import MAX_INFLIGHT_BLOCKS, Accounting
from kvgate.router.core.learn import Usage
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore, overdue_seconds
from kvgate.router.core.routing import RoutePlan

BODY = {"model": "m", "prompt": list(range(64)), "max_tokens": 4}


def test_streaming_attempt_leaves_pending_prefill_at_its_first_byte():
    accounts = Accounting()
    attempt = accounts.sent(
        "a", 0.0, uncached_tokens=100, predicted_ttft_seconds=1.0, streaming=True
    )
    assert accounts.load("a", 50.0) == (1, 1, 100, 0)  # no expiry for streams
    accounts.prefill_done(attempt)
    assert accounts.load("a", 50.0) == (1, 0, 0, 0)
    accounts.done(attempt)
    accounts.done(attempt)  # idempotent
    assert accounts.load("a", 50.0) == (0, 0, 0, 0)


def test_non_streaming_attempt_leaves_pending_prefill_at_its_predicted_ttft():
    accounts = Accounting()
    first = accounts.sent("a", 0.0, uncached_tokens=10, predicted_ttft_seconds=2.0, streaming=False)
    second = accounts.sent("a", 1.0, uncached_tokens=5, predicted_ttft_seconds=0.5, streaming=False)
    assert second.queued_ahead == 1
    assert accounts.load("a", 1.4) == (2, 2, 15, 0)
    assert accounts.load("a", 1.5) == (2, 1, 10, 0)  # the second's prediction passed first
    assert accounts.load("a", 2.0) == (2, 0, 0, 0)
    accounts.done(first)
    accounts.done(second)
    assert accounts.load("a", 3.0) == (0, 0, 0, 0)


def test_an_endpoint_that_rejoins_starts_from_zero():
    accounts = Accounting()
    old = accounts.sent("a", 0.0, uncached_tokens=10, predicted_ttft_seconds=1.0, streaming=True)
    accounts.forget("a")
    new = accounts.sent("a", 0.0, uncached_tokens=3, predicted_ttft_seconds=1.0, streaming=True)
    accounts.done(old)  # ends in its own account, not the new one
    assert accounts.load("a", 0.0) == (1, 1, 3, 0)
    accounts.done(new)
    assert accounts.load("a", 0.0) == (0, 0, 0, 0)


def test_batch_requests_are_counted_apart_while_in_flight():
    accounts = Accounting()
    online = accounts.sent("a", 0.0, uncached_tokens=10, predicted_ttft_seconds=1.0, streaming=True)
    batch = accounts.sent(
        "a", 0.0, uncached_tokens=90, predicted_ttft_seconds=1.0, streaming=True, batch=True
    )
    assert accounts.load("a", 0.0) == (2, 2, 100, 1)
    accounts.prefill_done(batch)  # still in flight: its decodes run beside the online request
    assert accounts.load("a", 0.0) == (2, 1, 10, 1)
    accounts.done(batch)
    accounts.done(batch)  # idempotent
    assert accounts.load("a", 0.0) == (1, 1, 10, 0)
    accounts.done(online)
    assert accounts.loads(["a"], 0.0) == [(0, 0, 0, 0)]


def test_in_flight_blocks_are_held_until_the_attempt_ends():
    accounts = Accounting()
    keys = [b"k0", b"k1", b"k2"]
    first = accounts.sent(
        "a", 0.0, uncached_tokens=48, predicted_ttft_seconds=1.0, streaming=True, block_keys=keys
    )
    second = accounts.sent(
        "a", 0.0, uncached_tokens=32, predicted_ttft_seconds=1.0, streaming=True,
        block_keys=keys[:2],
    )  # fmt: skip
    assert accounts.held([b"k0", b"k1", b"k2", b"k3"], ["a", "b"]) == {"a": 3}
    assert accounts.held([b"k1", b"k2"], ["a"]) == {"a": 2}  # any position of a chain
    assert accounts.held([b"x", b"k1"], ["a"]) == {}  # only leading blocks count
    assert [accounts.carrying("a", k) for k in keys] == [2, 2, 1]
    assert accounts.carrying("b", b"k0") == 0
    accounts.prefill_done(first)  # still running: its blocks stay pinned on the pod
    assert accounts.held(keys, ["a"]) == {"a": 3}
    accounts.done(first)
    accounts.done(first)  # idempotent: the second's count is intact
    assert accounts.held(keys, ["a"]) == {"a": 2}
    accounts.done(second)
    assert accounts.held(keys, ["a"]) == {}
    assert accounts.held([], ["a"]) == {}


def test_in_flight_blocks_are_bounded_per_endpoint():
    accounts = Accounting()
    many = [i.to_bytes(4, "big") for i in range(MAX_INFLIGHT_BLOCKS)]
    accounts.sent(
        "a", 0.0, uncached_tokens=1, predicted_ttft_seconds=1.0, streaming=True, block_keys=many
    )
    over = accounts.sent(
        "a", 0.0, uncached_tokens=1, predicted_ttft_seconds=1.0, streaming=True,
        block_keys=[b"new"],
    )  # fmt: skip
    assert accounts.load("a", 0.0).in_flight == 2  # counted, without its keys
    assert accounts.held([b"new"], ["a"]) == {}
    accounts.done(over)
    assert accounts.held(many[:2], ["a"]) == {"a": 2}


async def _core_with_kv_events(policy: str) -> RoutingCore:
    now = [100.0]
    config = make_config(3, policy={"name": policy, "seed": 1})
    core, endpoints = await routing_core(config, now, 3)
    pool = config.pools[0].key
    specs = [
        EndpointSpec(f"pod{i}:8000", pool, f"http://pod{i}:8000", kv_events=f"tcp://pod{i}:5557")
        for i in range(3)
    ]
    await endpoints.replace_pool(pool, specs)
    return core


PREFIX = list(range(1000, 1512))  # 32 blocks of 16 tokens
FOLLOWER = {"model": "m", "prompt": [*PREFIX, 7, 8, 9], "max_tokens": 4}


async def test_a_burst_with_one_new_prefix_follows_its_first_request_before_any_kv_event():
    """Pods with KV events get no routing history: the directory hears of a prompt's blocks
    only once they are computed. The requests in flight tell where they will be, so the second
    request of a burst goes to the first's pod (predicted hit) instead of recomputing the
    prefix on an idle one; once the first ends, only the directory counts."""
    core = await _core_with_kv_events("kvgate")
    first_request = ClientRequest(
        {"model": "m", "prompt": [*PREFIX, 1, 2, 3], "max_tokens": 4}, {}, "completion"
    )
    first = await core.plan(first_request)
    attempt = core.sent(first_request, first, streaming=True)
    second = await core.plan(ClientRequest(FOLLOWER, {}, "completion"))
    assert second.endpoint.id == first.endpoint.id
    assert second.decision.reason == "prefix-hit"
    assert second.decision.predicted_hit_tokens == len(PREFIX)
    core.cancelled(first, attempt)
    third = await core.plan(ClientRequest(FOLLOWER, {}, "completion"))
    assert third.decision.predicted_hit_tokens == 0


async def _send_stream(
    core: RoutingCore, count: int, prefix: list[int] = PREFIX
) -> list[RoutePlan]:
    """Send `count` short questions behind `prefix`, none finishing; returns their plans."""
    plans = []
    for i in range(count):
        request = ClientRequest(
            {"model": "m", "prompt": [*prefix, 1, 2, i], "max_tokens": 4}, {}, "completion"
        )
        plan = await core.plan(request)
        core.sent(request, plan, streaming=True)
        plans.append(plan)
    return plans


async def test_a_prefix_hot_on_its_pod_is_copied_once_that_pod_runs_four_more_requests():
    """A stream of short questions behind one new system prompt follows its first request
    (blocks in flight) while every pod is busy, until that pod carries the prefix in 5 requests
    and the others run 1: the router counts the holder's requests sharing the prefix, and
    `holder-load` then copies it instead of waiting for the 32-request gap a session's history
    gets."""
    core = await _core_with_kv_events("kvgate")
    other_prefixes = (list(range(5000, 5512)), list(range(6000, 6512)))
    busy = [(await _send_stream(core, 1, other))[0].endpoint.id for other in other_prefixes]
    plans = await _send_stream(core, 6)
    chosen = [p.endpoint.id for p in plans]
    assert chosen[0] not in busy and len(set(busy)) == 2
    assert chosen[:5] == [chosen[0]] * 5
    assert chosen[5] != chosen[0]
    assert plans[5].decision.reason == "load-bound"
    explained = {c["endpoint"]: c for c in plans[5].decision.to_dict()["candidates"]}
    assert explained[chosen[0]]["dropped_by"] == "holder-load"
    assert explained[chosen[0]]["prefix_sharers"] == 5
    assert explained[chosen[5]]["prefix_sharers"] == 0


async def test_a_burst_on_a_new_prefix_is_copied_to_idle_pods_at_two_requests_in_flight():
    """While other pods idle, the third request of a burst does not wait for the first's
    prefill on its pod: two requests in flight there carry the prefix, and `holder-load` copies
    it to an idle pod; the next goes to that copy, the one after to the last idle pod."""
    core = await _core_with_kv_events("kvgate")
    plans = await _send_stream(core, 5)
    chosen = [p.endpoint.id for p in plans]
    assert chosen[1] == chosen[0]
    assert chosen[2] != chosen[0]
    assert plans[2].decision.reason == "load-bound"
    explained = {c["endpoint"]: c for c in plans[2].decision.to_dict()["candidates"]}
    assert explained[chosen[0]]["dropped_by"] == "holder-load"
    assert explained[chosen[0]]["prefix_sharers"] == 2
    assert chosen[3] == chosen[2]
    assert len(set(chosen)) == 3 and chosen[4] not in chosen[:4]


@pytest.mark.parametrize(
    ("policy", "other_replicas", "shared"),
    [("kvgate", 1, True), ("kvgate", 0, False), ("llm-d-sticky", 1, False)],
    ids=["kvgate-with-peers", "kvgate-alone", "peer-policy-with-peers"],
)
async def test_blocks_in_flight_reach_the_other_replicas_through_the_directory(
    policy, other_replicas, shared
):
    """Each replica counts only its own requests in flight. While other replicas share the
    pool's directory (a fresh load-sharing view), kvgate records a request's blocks there as
    approximate entries before sending it, so theirs follow it to its pod before the KV events;
    alone, or under a peer's re-implementation, the directory stays the pods' own word."""
    core = await _core_with_kv_events(policy)
    core.peers.update({f"replica-{i}": {} for i in range(other_replicas)}, core.clock())
    request = ClientRequest(
        {"model": "m", "prompt": [*PREFIX, 1, 2, 3], "max_tokens": 4}, {}, "completion"
    )
    plan = await core.plan(request)
    index = core.learner.indexes[plan.pool.key]
    held = await index.lookup(plan.keys.block_keys)
    assert held == ({plan.endpoint.id: len(PREFIX) // 16} if shared else {})


async def test_the_peers_re_implementations_see_the_directory_only():
    """In-flight blocks are kvgate's own: the peers' published routers match on their index."""
    core = await _core_with_kv_events("llm-d-sticky")
    first_request = ClientRequest(
        {"model": "m", "prompt": [*PREFIX, 1, 2, 3], "max_tokens": 4}, {}, "completion"
    )
    core.sent(first_request, await core.plan(first_request), streaming=True)
    second = await core.plan(ClientRequest(FOLLOWER, {}, "completion"))
    assert second.decision.predicted_hit_tokens == 0


async def _core(n: int = 2) -> tuple[RoutingCore, list[float]]:
    now = [100.0]
    core, _ = await routing_core(make_config(n), now, n)
    return core, now


async def test_a_request_is_in_flight_from_sent_until_finished_and_its_outcome_is_learned():
    core, now = await _core()
    request = ClientRequest(BODY, {}, "completion", request_id="r1")
    plan = await core.plan(request)
    attempt = core.sent(request, plan, streaming=True)
    assert core.endpoint_load()[plan.endpoint.id] == 1
    now[0] += 0.25
    core.first_byte(plan, attempt, streamed=True)
    now[0] += 1.0
    outcome = core.finished(
        request,
        plan,
        attempt,
        status=200,
        usage=Usage(prompt_tokens=64, cached_tokens=0, completion_tokens=4),
        completed=True,
        streamed=True,
    )
    assert outcome.ttft_seconds == 0.25 and outcome.duration_seconds == 1.25
    assert outcome.retries == 0
    assert all(n == 0 for n in core.endpoint_load().values())


async def test_failures_before_the_first_byte_eject_and_the_retry_avoids_the_pod():
    core, now = await _core()
    limits = core.state.config.limits
    request = ClientRequest(BODY, {}, "completion")
    plan = await core.plan(request)
    bad = plan.endpoint
    for _ in range(limits.eject_after_failures):
        attempt = core.sent(ClientRequest(BODY, {}, "completion"), plan, streaming=False)
        core.failed(plan, attempt, "connect")
    assert not bad.healthy(now[0])
    request.tried.append(bad.id)
    retry = await core.plan(request)
    assert retry.endpoint.id != bad.id
    assert all(n == 0 for n in core.endpoint_load().values())
    # /metrics answering says nothing of its answers: it stays out its eject_seconds.
    core.load_scraped(bad, LoadSample(scraped_at=now[0]))
    assert not bad.healthy(now[0])
    now[0] += limits.eject_seconds
    assert bad.healthy(now[0])


def _stream_that_breaks(core: RoutingCore, plan: RoutePlan) -> None:
    """A stream that starts (its first byte) and then breaks, as the proxy reports it."""
    request = ClientRequest(BODY, {}, "completion")
    attempt = core.sent(request, plan, streaming=True)
    core.first_byte(plan, attempt, streamed=True)
    core.broke(plan, "stream")
    core.finished(request, plan, attempt, status=200, usage=None, completed=False, streamed=True)


def _complete_stream(core: RoutingCore, plan: RoutePlan, *, cancelled: bool = False) -> None:
    request = ClientRequest(BODY, {}, "completion")
    attempt = core.sent(request, plan, streaming=True)
    core.first_byte(plan, attempt, streamed=True)
    if cancelled:
        core.cancelled(plan, attempt)
    else:
        core.finished(request, plan, attempt, status=200, usage=None, completed=True, streamed=True)


async def test_streams_that_break_after_their_first_byte_eject_the_pod():
    """A pod that starts every answer and breaks it fails as one that fails at once: a first
    byte is no success, a complete answer is (it starts the count again), and a client that
    hangs up counts for nothing."""
    core, now = await _core()
    limits = core.state.config.limits
    plan = await core.plan(ClientRequest(BODY, {}, "completion"))
    pod = plan.endpoint
    for _ in range(limits.eject_after_failures - 1):
        _stream_that_breaks(core, plan)
        _complete_stream(core, plan, cancelled=True)
    assert pod.healthy(now[0])
    _complete_stream(core, plan)  # the count starts again
    for _ in range(limits.eject_after_failures - 1):
        _stream_that_breaks(core, plan)
    assert pod.healthy(now[0])
    _stream_that_breaks(core, plan)
    assert not pod.healthy(now[0])
    core.load_scraped(pod, LoadSample(scraped_at=now[0]))  # its /metrics still answers
    assert not pod.healthy(now[0])
    now[0] += limits.eject_seconds
    assert pod.healthy(now[0])
    assert all(n == 0 for n in core.endpoint_load().values())


async def test_clients_that_give_up_on_a_hung_pods_first_byte_eject_it():
    """A hung engine answers headers and /metrics but no token: clients that time out before
    the router's first_byte_timeout left no trace, and the pod, idle again, got the next
    request. A stream given up long past its predicted TTFT counts as a failure; one given up
    early, or after its first byte, does not."""
    core, now = await _core()
    limits = core.state.config.limits
    plan = await core.plan(ClientRequest(BODY, {}, "completion"))
    pod = plan.endpoint

    def given_up_after(seconds: float) -> None:
        attempt = core.sent(ClientRequest(BODY, {}, "completion"), plan, streaming=True)
        now[0] += seconds
        core.cancelled(plan, attempt)

    for _ in range(limits.eject_after_failures):
        given_up_after(overdue_seconds(plan.decision) / 2)  # the user stopped it: no failure
        _complete_stream(core, plan, cancelled=True)
    assert pod.healthy(now[0])
    # Several clients give up at once on a busy pod that gave another request its first
    # byte meanwhile: alive, not hung (they all ejected it, one after another).
    request = ClientRequest(BODY, {}, "completion")
    waiting = [core.sent(request, plan, streaming=True) for _ in range(4)]
    now[0] += 1.0
    core.first_byte(plan, waiting[0], streamed=True)
    now[0] += overdue_seconds(plan.decision)
    for attempt in waiting[1:]:
        core.cancelled(plan, attempt)
    core.cancelled(plan, waiting[0])
    assert pod.healthy(now[0])
    for _ in range(limits.eject_after_failures - 1):
        given_up_after(overdue_seconds(plan.decision))
    assert pod.healthy(now[0])
    given_up_after(overdue_seconds(plan.decision))
    assert not pod.healthy(now[0])
    assert all(n == 0 for n in core.endpoint_load().values())


async def test_failed_scrapes_eject_until_metrics_answer_again():
    core, now = await _core()
    limits = core.state.config.limits
    [pod, *_] = core.endpoints.all()
    for _ in range(limits.eject_after_failures):
        core.scrape_failed(pod, TimeoutError())
    assert not pod.healthy(now[0])
    core.load_scraped(pod, LoadSample(scraped_at=now[0]))  # it restarted: back at once
    assert pod.healthy(now[0])


async def test_a_scrape_remembers_which_waiting_requests_were_ours():
    """The engine's waiting count includes our requests that waited when it was scraped: once
    they are answered, the pod's snapshot must not take them for someone else's."""
    core, now = await _core()
    request = ClientRequest(BODY, {}, "completion")
    plan = await core.plan(request)
    attempt = core.sent(request, plan, streaming=True)
    core.load_scraped(plan.endpoint, LoadSample(waiting=1, running=0, scraped_at=now[0]))
    now[0] += 0.05
    core.first_byte(plan, attempt, streamed=True)
    [snapshot] = core.router.snapshots([plan.endpoint], now[0])
    assert snapshot.pending_prefill_requests == 0
    assert snapshot.engine is not None and snapshot.engine.pending_at_scrape == 1
    explained = await core.explain(ClientRequest(BODY, {}, "completion"))
    lines = {c.estimate.endpoint_id: c.to_dict() for c in explained.decision.candidates}
    assert lines[plan.endpoint.id]["foreign_waiting"] == 0
    # a later scrape sees none of ours waiting: its three waiting are someone else's
    core.load_scraped(plan.endpoint, LoadSample(waiting=3, running=1, scraped_at=now[0]))
    [snapshot] = core.router.snapshots([plan.endpoint], now[0])
    assert snapshot.engine is not None and snapshot.engine.pending_at_scrape == 0
    explained = await core.explain(ClientRequest(BODY, {}, "completion"))
    lines = {c.estimate.endpoint_id: c.to_dict() for c in explained.decision.candidates}
    assert lines[plan.endpoint.id]["foreign_waiting"] == 3


async def test_an_engine_report_older_than_the_stale_limit_reaches_no_policy():
    """Every scorer reads the engine's numbers only from the snapshot, so the router's one
    `load_metrics.stale_after_seconds` decides for all of them when a scrape is too old."""
    core, now = await _core()
    [endpoint, *_] = core.endpoints.all()
    core.load_scraped(endpoint, LoadSample(waiting=3, running=1, scraped_at=now[0]))
    stale_after = core.router.state.config.load_metrics.stale_after_seconds
    now[0] += stale_after
    [snapshot] = core.router.snapshots([endpoint], now[0])
    assert snapshot.engine is not None and snapshot.engine.waiting == 3
    now[0] += 0.01
    [snapshot] = core.router.snapshots([endpoint], now[0])
    assert snapshot.engine is None


async def test_a_cancelled_attempt_is_released_and_teaches_nothing():
    core, _now = await _core()
    request = ClientRequest(BODY, {}, "completion")
    plan = await core.plan(request)
    attempt = core.sent(request, plan, streaming=True)
    core.cancelled(plan, attempt)
    assert all(n == 0 for n in core.endpoint_load().values())
    assert core.estimator.rate(plan.endpoint.id) is None


async def test_ttfts_teach_one_prefill_rate_per_pool():
    """A streamed TTFT with nothing queued ahead is a prefill observation; every pod of the pool
    is then priced at the median of its pods' estimates (one engine spec, one rate: per-pod
    noise must not make one pod look faster and draw the traffic)."""
    core, now = await _core(3)
    for pod_index, seconds in ((0, 0.5), (1, 0.25), (2, 0.05)):
        request = ClientRequest(BODY, {}, "completion")
        plan = await core.plan(request)
        plan = replace(plan, endpoint=core.endpoints.all()[pod_index])
        attempt = core.sent(request, plan, streaming=True)
        now[0] += seconds
        core.first_byte(plan, attempt, streamed=True)
        core.finished(
            request,
            plan,
            attempt,
            status=200,
            usage=Usage(prompt_tokens=4096, cached_tokens=0, completion_tokens=4),
            completed=True,
            streamed=True,
        )
    rates = [core.estimator.rate(ep.id) for ep in core.endpoints.all()]
    assert all(r is not None for r in rates)
    snapshots = core.router.snapshots(core.endpoints.all(), now[0])
    priced = {s.prefill_tokens_per_second for s in snapshots}
    assert priced == {sorted(rates)[1]}  # the median, for every pod


async def test_a_cold_prompt_goes_where_this_router_wrote_least_into_a_filled_cache():
    """Once every pod reports a KV cache it has filled (each token written there evicts a
    block), a prompt no pod holds goes, among the pods with the fewest requests, to the one
    this router sent the fewest uncached prompt tokens lately: vLLM evicts the least recently
    used block first, so there it evicts the blocks used longest ago."""
    core, now = await _core(3)
    for ep in core.endpoints.all():
        full = LoadSample(scraped_at=now[0], kv_capacity_tokens=1000, kv_written_tokens=5000.0)
        core.load_scraped(ep, full)
    chosen = []
    for i, length in enumerate([64, 48, 32, 40]):
        body = {"model": "m", "prompt": [i * 1000 + k for k in range(length)], "max_tokens": 4}
        request = ClientRequest(body, {}, "completion")
        plan = await core.plan(request)
        assert plan.decision.to_dict()["tie_break"] == "least-turnover"
        attempt = core.sent(request, plan, streaming=True)
        core.cancelled(plan, attempt)  # done: every pod has no request again
        chosen.append(plan.endpoint.id)
        now[0] += 0.1  # the scrapes stay fresh
    assert len(set(chosen[:3])) == 3  # each went where nothing had been written yet
    assert chosen[3] == chosen[2]  # then to the pod sent the fewest tokens (32)


async def test_explain_records_nothing():
    core, _now = await _core()
    before = [core.router.history.last_chosen(ep.id) for ep in core.endpoints.all()]
    plan = await core.explain(ClientRequest(BODY, {}, "completion"))
    assert plan.endpoint.id in core.endpoint_load()
    after = [core.router.history.last_chosen(ep.id) for ep in core.endpoints.all()]
    assert before == after


async def test_a_pod_that_leaves_while_the_directory_answers_is_not_chosen():
    """Discovery may remove a pod during the directory lookup (an await): the decision is made
    again without it, instead of failing the request."""
    now = [100.0]
    config = make_config(2)
    core, endpoints = await routing_core(config, now, 2)
    pool = config.pools[0].key
    index = core.router.indexes[pool]

    class LeavingIndex:
        async def lookup(self, keys, pods, medium=None):  # type: ignore[no-untyped-def]
            await endpoints.replace_pool(pool, [endpoints.get("pod1:8000").spec])  # type: ignore[union-attr]
            return {"pod0:8000": len(keys)}  # pod0 holds the whole prompt: the policy wants it

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(index, name)

    core.router.indexes = {pool: LeavingIndex()}  # type: ignore[dict-item]
    plan = await core.plan(ClientRequest(BODY, {}, "completion"))
    assert plan.endpoint.id == "pod1:8000"


async def test_whole_answers_teach_the_pools_output_length_and_price_its_decode():
    """The answers' completion tokens teach the pool's expected output; a request's own
    `max_tokens` caps it, and each pod's decode is priced on the KV its requests hold (only
    for a policy that prices it, and only while the pool's answers are long next to their
    prompts)."""
    now = [100.0]
    config = make_config(2, policy={"seed": 1, "params": {"decode_weight": 0.25}})
    core, _ = await routing_core(config, now, 2)
    for completed in (True,) * 8 + (False,):
        request = ClientRequest(BODY, {}, "completion")
        plan = await core.plan(request)
        attempt = core.sent(request, plan, streaming=True)
        now[0] += 0.1
        core.first_byte(plan, attempt, streamed=True)
        tokens = 300 if completed else 5000  # a cut-off answer says nothing of the length
        usage = Usage(prompt_tokens=64, cached_tokens=0, completion_tokens=tokens)
        core.finished(
            request, plan, attempt, status=200, usage=usage, completed=completed, streamed=True
        )
    pool = plan.pool.key
    assert core.output_lengths.expected(pool) == pytest.approx(300.0)
    busy, light = core.endpoints.all()
    for endpoint, usage in ((busy, 0.5), (light, 0.1)):
        sample = LoadSample(
            waiting=0,
            running=2,
            kv_cache_usage=usage,
            scraped_at=now[0],
            kv_capacity_tokens=100_000,
        )
        core.load_scraped(endpoint, sample)
    seconds_per_token = core.router.state.policy.cost_model.params.decode_seconds_per_kv_token
    for body, output in ((BODY, 4), ({**BODY, "max_tokens": 1000}, 300.0)):
        explained = await core.explain(ClientRequest(body, {}, "completion"))
        lines = {c.estimate.endpoint_id: c.to_dict() for c in explained.decision.candidates}
        assert lines[busy.id]["decode_seconds"] == pytest.approx(
            output * 50_000 * seconds_per_token
        )
        assert lines[light.id]["decode_seconds"] == pytest.approx(
            output * 10_000 * seconds_per_token
        )
    # answers short next to their prompts (under `decode_min_output_ratio`, 0.3): not priced
    for _ in range(60):
        core.output_lengths.observe(pool, 300, 5000)
    assert core.output_lengths.output_ratio(pool) < 0.3
    explained = await core.explain(ClientRequest(BODY, {}, "completion"))
    assert all(c.to_dict()["decode_seconds"] == 0.0 for c in explained.decision.candidates)
    unpriced = make_config(2, policy={"seed": 1, "params": {"decode_weight": 0.0}})
    plain, _ = await routing_core(unpriced, now, 2)
    assert plain.router.state.policy.decode_min_output_ratio is None
    for _ in range(8):
        plain.output_lengths.observe(pool, 300, 64)  # learned, but not asked for
    plain.load_scraped(plain.endpoints.all()[0], sample)
    explained = await plain.explain(ClientRequest(BODY, {}, "completion"))
    assert all(c.to_dict()["decode_seconds"] == 0.0 for c in explained.decision.candidates)


async def test_pools_keyed_apart_share_the_traffic_while_equally_idle():
    """Two pools of one model whose engines differ only in max_model_len key apart (a group
    each); with every pod idle the groups tie, and the first group took every request."""
    now = [100.0]
    pools = [
        {
            "name": name,
            "model": "m",
            "engine": {"max_model_len": length},
            "endpoints": {"static": [{"url": f"http://{name}{i}:8000"} for i in range(2)]},
        }
        for name, length in (("a", 8192), ("b", 16384))
    ]
    config = make_config(
        pools=pools, policy={"name": "round-robin"}, flow_control={"enabled": False}
    )
    core = await static_core(config, now)
    chosen = []
    for i in range(8):  # one at a time
        body = {"model": "m", "prompt": list(range(i * 1000, i * 1000 + 64)), "max_tokens": 4}
        request = ClientRequest(body, {}, "completion", body_bytes=100)
        plan = await core.route(request)
        attempt = core.sent(request, plan, streaming=True)
        core.first_byte(plan, attempt, streamed=True)
        core.finished(request, plan, attempt, status=200, usage=None, completed=True, streamed=True)
        chosen.append(plan.endpoint.id)
        now[0] += 1.0
    assert sorted(chosen) == sorted(["a0:8000", "a1:8000", "b0:8000", "b1:8000"] * 2)


async def test_the_hit_rate_series_count_only_answers_that_report_their_cached_tokens():
    """An embedding's usage has no cached tokens, an error or a broken continuous-usage stream
    none or no usage: counted, they showed hits as misses (0.66 on the engines, 0.17 on the
    router's panel) and the predicted rate above 100%."""
    core, _now = await _core()
    registry = core.metrics.registry

    def series() -> tuple[float, float, float]:
        names = ("prompt_tokens", "cached_tokens", "predicted_prefix_hit_tokens")
        values = [
            sum(
                s.value
                for metric in registry.collect()
                if metric.name == f"kvgate_router_{name}"
                for s in metric.samples
                if s.name.endswith("_total")
            )
            for name in names
        ]
        return values[0], values[1], values[2]

    def answer(usage: Usage | None, status: int = 200) -> None:
        request = ClientRequest(BODY, {}, "completion")
        attempt = core.sent(request, plan, streaming=False)
        core.finished(
            request, plan, attempt, status=status, usage=usage, completed=True, streamed=False
        )

    plan = await core.plan(ClientRequest(BODY, {}, "completion"))
    plan = replace(plan, decision=replace(plan.decision, predicted_hit_tokens=32))
    answer(Usage(prompt_tokens=64, cached_tokens=None, completion_tokens=0))  # an embedding
    answer(None, status=400)  # the pod refused it
    assert series() == (0, 0, 0)
    answer(Usage(prompt_tokens=64, cached_tokens=48, completion_tokens=4))
    assert series() == (64, 48, 32)
