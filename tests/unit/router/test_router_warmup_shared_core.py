"""Warm-ups shared between router replicas: claims, follows, their timeouts and fallbacks, the
pooled hot-prefix ranking, and what a replica reads back of the others' counts."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from unittest.mock import AsyncMock

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from tests.unit.router.fakes import make_config, routing_core

from kvgate.api.fleet import WarmupConfig
from kvgate.api.router_config import RouterConfig
from kvgate.directory.shared_warmup import (
    MAX_HOT_FIELD_BYTES,
    MAX_SHARED_PREFIXES,
    MemoryWarmClaims,
    encode_counts,
    parse_counts,
)
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.peer_prefixes import PeerPrefixCounts
from kvgate.router.core.warmup_claims import FOLLOW_POLL_SECONDS
from kvgate.router.http.warm_sharing import WarmupSharer

POOL = "default/p"
SYSTEM_A = list(range(1000, 1512))  # 512 tokens: 32 blocks of 16
SYSTEM_B = list(range(3000, 3512))
NEW = "pod2:8000"


async def _core(**warmup: object) -> tuple[RoutingCore, EndpointSet, list[float]]:
    now = [100.0]
    core, endpoints = await routing_core(make_config(2, warmup=warmup), now, 2)
    core.warmup.shared = True  # as on the Redis directory
    return core, endpoints, now


async def _send(core: RoutingCore, count: int, system: list[int]) -> None:
    for i in range(count):
        body = {"model": "m", "prompt": system + [i] * 40, "max_tokens": 4}
        await core.plan(ClientRequest(body, {}, "completion"))


async def _join(endpoints: EndpointSet, n: int = 3) -> None:
    # pod0 and pod1 as `routing_core` made them; the new pod with a generation (its pod UID)
    specs = [EndpointSpec(f"pod{i}:8000", POOL, f"http://pod{i}:8000",
                          generation=f"uid{i}" if i >= 2 else "") for i in range(n)]  # fmt: skip
    await endpoints.replace_pool(POOL, specs)


def _phase(core: RoutingCore, endpoints: EndpointSet, now: float) -> dict[str, object]:
    states = core.warmup.debug(now, endpoints.all())["endpoints"]
    return next(s for s in states if s["endpoint"] == NEW)


def _metric(core: RoutingCore, result: str) -> float:
    return (
        core.metrics.registry.get_sample_value(
            "kvgate_router_warmups_total", {"pool": POOL, "result": result}
        )
        or 0.0
    )


async def test_a_joining_pod_is_held_back_while_its_claim_is_decided():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    assert core.warmup.take() == []  # nothing is sent before the claim is answered
    (claim,) = core.warmup.claims.take()
    assert (claim.endpoint_id, claim.generation, claim.can_warm) == (NEW, "uid2", True)
    assert core.warmup.claims.take() == []  # each claim is handed out once
    assert not core.warmup.admits(NEW, now[0], random.Random(0))
    assert _phase(core, endpoints, now[0])["role"] == "claiming"


async def test_the_claimant_warms_with_the_prefixes_all_replicas_asked_for_most():
    core, endpoints, now = await _core(top_prefixes=1)
    await _send(core, 5, SYSTEM_A)  # this replica saw A most ...
    await _send(core, 3, SYSTEM_B)
    key_b = core.warmup.hot.top(POOL, 2, now[0])[1].key
    # ... the other replicas saw B far more often
    core.warmup.peer_counts.update(POOL, {"r1": {key_b: 10.0}, "r2": {key_b: 9.0}}, now[0])
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "claimed", now[0], warmed_by="me")
    (request,) = core.warmup.take()
    assert request.body()["prompt"] == SYSTEM_B
    assert _phase(core, endpoints, now[0])["role"] == "claimed"
    debug = core.warmup.debug(now[0], endpoints.all())
    assert debug["peer_replicas"] == {POOL: 2}
    assert debug["top"][POOL][0]["peer_requests"] == 19.0


async def test_a_prefix_hot_on_the_other_replicas_is_kept_the_first_time_it_comes_here():
    core, _, now = await _core()
    await _send(core, 1, SYSTEM_B)
    assert not core.warmup.hot.has(POOL)  # once is not enough (min_requests 2) ...
    body = {"model": "m", "prompt": SYSTEM_A + [7] * 40, "max_tokens": 4}
    key_a = (await core.explain(ClientRequest(body, {}, "completion"))).keys.block_keys[31]
    core.warmup.peer_counts.update(POOL, {"r1": {key_a: 4.0}}, now[0])
    await _send(core, 1, SYSTEM_A)  # ... unless the other replicas saw it too
    (kept,) = core.warmup.hot.top(POOL, 8, now[0])
    assert kept.key == key_a and kept.tokens is not None and kept.tokens.tolist() == SYSTEM_A


async def test_a_stale_view_of_the_others_counts_is_not_used():
    peers = PeerPrefixCounts(ttl_seconds=15.0)
    peers.update(POOL, {"r1": {b"k": 2.0, b"j": 1.0}, "r2": {b"k": 3.0}}, now=10.0)
    assert peers.counts(POOL, 20.0) == {b"k": 5.0, b"j": 1.0}
    assert peers.replicas(POOL, 20.0) == 2
    assert peers.counts(POOL, 25.1) == {} and peers.replicas(POOL, 25.1) == 0
    assert peers.counts("other/pool", 10.0) == {}


async def test_the_claimant_marks_its_warm_up_done_when_it_ends():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "claimed", now[0])
    (request,) = core.warmup.take()
    assert core.warmup.claims.in_progress() and core.warmup.claims.take_reports() == []
    core.warmup.request_done(request, now[0], ok=True, prompt_tokens=512)
    (report,) = core.warmup.claims.take_reports()
    assert (report.endpoint_id, report.generation) == (NEW, "uid2")
    assert core.warmup.admits(NEW, now[0], random.Random(0))
    assert not core.warmup.claims.in_progress()


async def test_a_claimed_warm_up_that_times_out_is_reported_done_too():
    core, endpoints, now = await _core(ramp_seconds=0.0, timeout_seconds=30.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "claimed", now[0])
    assert core.warmup.take()
    assert core.warmup.claims.in_progress()
    core.warmup.claims.advance(now[0] + 29.0)
    assert core.warmup.claims.take_reports() == []  # still warming
    core.warmup.claims.advance(now[0] + 30.0)  # the poll advances it past its deadline
    assert core.warmup.claims.in_progress()  # its report is still to be written
    (report,) = core.warmup.claims.take_reports()
    assert report.endpoint_id == NEW and _metric(core, "timed_out") == 1


async def test_a_follower_holds_the_pod_back_until_the_claimant_is_done_then_ramps():
    core, endpoints, now = await _core(ramp_seconds=10.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "follow", now[0], warmed_by="replica-a")
    assert core.warmup.take() == []  # the other replica sends the warm requests
    rng = random.Random(0)
    for _ in range(3):
        now[0] += 1.0
        (followed,) = core.warmup.claims.following()
        core.warmup.claims.follow_result(followed, "warming", now[0])
        assert not core.warmup.admits(NEW, now[0], rng)
        for i in range(5):
            body = {"model": "m", "prompt": SYSTEM_A + [50 + i] * 40, "max_tokens": 4}
            assert (await core.plan(ClientRequest(body, {}, "completion"))).endpoint.id != NEW
    state = _phase(core, endpoints, now[0])
    assert (state["phase"], state["role"], state["warmed_by"]) == (
        "warming", "following", "replica-a"
    )  # fmt: skip
    core.warmup.claims.follow_result(followed, "done", now[0])
    assert _phase(core, endpoints, now[0])["phase"] == "ramping"  # as if warmed here
    now[0] += 5.0
    share = sum(core.warmup.admits(NEW, now[0], rng) for _ in range(1000)) / 1000
    assert 0.4 < share < 0.6
    assert _metric(core, "followed") == 1 and core.warmup.claims.following() == []


async def test_a_claimant_that_never_finishes_holds_the_pod_back_no_longer_than_the_timeout():
    core, endpoints, now = await _core(ramp_seconds=0.0, timeout_seconds=20.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "follow", now[0], warmed_by="gone-replica")
    core.warmup.claims.advance(now[0] + 19.0)
    assert core.warmup.claims.following()
    core.warmup.claims.advance(now[0] + 20.0)
    assert core.warmup.claims.following() == []  # its own deadline: it ramps
    assert core.warmup.admits(NEW, now[0] + 20.0, random.Random(0))
    assert _phase(core, endpoints, now[0] + 20.0)["timed_out"] is True


async def test_a_done_mark_that_failed_is_reported_again_while_its_claim_lives():
    core, endpoints, now = await _core(ramp_seconds=0.0, timeout_seconds=30.0)
    claims = core.warmup.claims
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = claims.take()
    claims.claim_result(claim, "claimed", now[0])
    (request,) = core.warmup.take()
    core.warmup.request_done(request, now[0], ok=True)
    (report,) = claims.take_reports()
    claims.requeue_report(report, now[0])  # Redis failed: again at the next round
    claims.requeue_report(report, now[0])  # (once)
    assert claims.in_progress() and claims.take_reports() == [report]
    claims.requeue_report(report, now[0] + 30.0)  # the claim expired: nobody waits for it
    assert claims.take_reports() == []
    claims.requeue_report(report, now[0])
    await _join(endpoints, 2)  # the pod left: nothing to report
    assert claims.take_reports() == []
    claims.requeue_report(report, now[0])
    assert claims.take_reports() == []


class _FlakyClaims(MemoryWarmClaims):
    """In-process claims whose first `done` fails as Redis would."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self.done_calls = 0

    async def done(self, pod: str, generation: str, replica: str, *, grace_seconds: float) -> bool:
        self.done_calls += 1
        if self.done_calls == 1:
            raise RedisConnectionError("connection reset")
        return await super().done(pod, generation, replica, grace_seconds=grace_seconds)


async def test_the_sharer_retries_a_done_mark_redis_failed_so_followers_do_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core, endpoints, now = await _core(ramp_seconds=0.0)
    config = make_config(2, directory={"backend": "redis"}, warmup={"ramp_seconds": 0.0})
    directory = _FlakyClaims(lambda: now[0])
    sharer = WarmupSharer(
        core, lambda: config, core.metrics, lambda: None, replica="a", clock=lambda: now[0]
    )
    monkeypatch.setattr(sharer.redis, "client", AsyncMock(return_value=None))
    monkeypatch.setattr(sharer, "_claims_of", lambda *_: directory)
    sharer._next_publish = float("inf")  # the hot counts are not this test's
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    assert await sharer.step(config)  # claimed
    (request,) = core.warmup.take()
    core.warmup.request_done(request, now[0], ok=True)
    assert not await sharer.step(config)  # the done mark fails ...
    assert await directory.states([(NEW, "uid2")]) == ["warming"]
    assert sharer.delay(config) == FOLLOW_POLL_SECONDS  # ... is retried soon ...
    assert await sharer.step(config)
    assert await directory.states([(NEW, "uid2")]) == ["done"]  # ... and the followers ramp
    errors = {"pool": POOL, "operation": "done"}
    assert (
        core.metrics.registry.get_sample_value("kvgate_router_warm_sharing_errors_total", errors)
        == 1
    )


@pytest.mark.parametrize("state", ["done", "gone"])
async def test_a_claim_done_or_gone_ends_the_follow(state):
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "follow", now[0], warmed_by="a")
    (followed,) = core.warmup.claims.following()
    core.warmup.claims.follow_result(followed, state, now[0])
    assert core.warmup.admits(NEW, now[0], random.Random(0))
    assert core.warmup.take() == []


async def test_a_pod_warmed_already_by_another_replica_ramps_at_once():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(claim, "done", now[0], warmed_by="a")
    assert core.warmup.take() == [] and core.warmup.admits(NEW, now[0], random.Random(0))
    assert _metric(core, "followed") == 1


@pytest.mark.parametrize("when", ["claim", "follow"])
async def test_when_the_directory_fails_the_replica_warms_the_pod_from_its_own_history(when):
    core, endpoints, now = await _core(ramp_seconds=0.0, timeout_seconds=30.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    if when == "claim":
        core.warmup.claims.claim_result(claim, "failed", now[0])
    else:
        core.warmup.claims.claim_result(claim, "follow", now[0], warmed_by="a")
        now[0] += 2.0
        (followed,) = core.warmup.claims.following()
        core.warmup.claims.follow_result(followed, "failed", now[0])
    (request,) = core.warmup.take()  # exactly what it sends without sharing
    assert request.body()["prompt"] == SYSTEM_A
    state = _phase(core, endpoints, now[0])
    assert (state["phase"], state["role"]) == ("warming", "own")
    assert core.warmup.deadline(NEW) == 130.0  # within the same deadline
    core.warmup.request_done(request, now[0], ok=True, prompt_tokens=512)
    assert core.warmup.claims.take_reports() == []  # nobody follows an own warm-up
    assert core.warmup.admits(NEW, now[0], random.Random(0))


async def test_a_replica_with_nothing_hot_claims_nothing_and_does_not_hold_the_pod_back():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _join(endpoints)
    (claim,) = core.warmup.claims.take()
    assert not claim.can_warm
    core.warmup.claims.claim_result(claim, "nothing", now[0])
    assert core.warmup.admits(NEW, now[0], random.Random(0))
    assert _metric(core, "nothing_hot") == 1


async def test_an_answer_for_an_earlier_join_is_ignored():
    core, endpoints, now = await _core(ramp_seconds=0.0)
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    (old,) = core.warmup.claims.take()
    await _join(endpoints, 2)  # it left ...
    now[0] += 1.0
    await _join(endpoints)  # ... and came back
    (new,) = core.warmup.claims.take()
    core.warmup.claims.claim_result(old, "done", now[0])
    assert _phase(core, endpoints, now[0])["role"] == "claiming"
    core.warmup.claims.claim_result(new, "claimed", now[0])
    assert len(core.warmup.take()) == 1


async def test_without_sharing_no_claim_is_made():
    core, endpoints, _ = await _core()
    core.warmup.shared = False
    await _send(core, 3, SYSTEM_A)
    await _join(endpoints)
    assert core.warmup.claims.take() == []
    assert len(core.warmup.take()) == 1


async def test_what_a_replica_publishes_is_its_own_counts_of_its_hottest_prefixes():
    core, _, now = await _core()
    await _send(core, 5, SYSTEM_A)
    await _send(core, 2, SYSTEM_B)
    core.warmup.peer_counts.update(POOL, {"r1": {b"x" * 32: 100.0}}, now[0])
    counts = core.warmup.hot.shared_counts(POOL, 3, now[0])
    assert len(counts) == 3 and b"x" * 32 not in counts  # never the others' counts
    assert max(counts.values()) == pytest.approx(5.0)
    assert parse_counts(encode_counts(counts).encode()) == pytest.approx(counts)


def test_counts_read_back_from_redis_are_checked_and_bounded():
    key = "ab" * 32
    good = {key: 3.5, "cd" * 16: 1}
    assert parse_counts(json.dumps(good).encode()) == {bytes.fromhex(key): 3.5, b"\xcd" * 16: 1.0}
    bad = {
        "zz": 1.0,  # not hex
        "a": 1.0,  # odd length
        "ab cd": 1.0,  # fromhex would skip the space
        "ab" * 65: 1.0,  # key over 64 bytes
        "01": -1.0,
        "02": True,
        "03": "1",
        "04": 2e9,
        "05": [1],
    }
    assert parse_counts(json.dumps(bad).encode()) == {}
    assert parse_counts(b'{"06": NaN, "07": Infinity, "08": -Infinity, "09": 1e400}') == {}
    # an integer too large for a float is dropped, not an OverflowError that ends the exchange
    huge = b'{"0a": 1' + b"0" * 400 + b', "0b": 2}'
    assert parse_counts(huge) == {b"\x0b": 2.0}
    assert parse_counts(b'{"0c": 1' + b"0" * 5000 + b"}") == {}  # past int()'s digit limit
    # nested past what Python's parser can recurse: unreadable, not a RecursionError that
    # fails the warm-sharing operation
    assert parse_counts(b'{"0d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}") == {}
    assert parse_counts(b"not json") == {} and parse_counts(b"[1]") == {}
    assert parse_counts(b"{" + b" " * MAX_HOT_FIELD_BYTES + b"}") == {}
    many = {f"{i:08x}": 1.0 for i in range(MAX_SHARED_PREFIXES + 10)}
    assert len(parse_counts(json.dumps(many).encode())) == MAX_SHARED_PREFIXES
    assert len(
        json.loads(encode_counts({bytes([i % 256, i // 256]): 1.0 for i in range(5000)}))
    ) == (MAX_SHARED_PREFIXES)


async def test_in_process_claims_follow_redis_semantics():
    now = [0.0]
    claims = MemoryWarmClaims(lambda: now[0])
    claim = claims.claim
    assert await claim("p", "g1", "a", can_warm=False, ttl_seconds=60) == ("nothing", "")
    assert await claim("p", "g1", "a", can_warm=True, ttl_seconds=60) == ("claimed", "a")
    assert await claim("p", "g1", "b", can_warm=True, ttl_seconds=60) == ("follow", "a")
    assert await claim("p", "g1", "c", can_warm=False, ttl_seconds=60) == ("follow", "a")
    assert await claims.states([("p", "g1"), ("p", "g0"), ("q", "g1")]) == [
        "warming", "gone", "gone"
    ]  # fmt: skip
    assert not await claims.done("p", "g1", "b", grace_seconds=10)  # not b's
    assert await claims.done("p", "g1", "a", grace_seconds=10)
    assert await claims.states([("p", "g1")]) == ["done"]
    assert await claim("p", "g1", "d", can_warm=True, ttl_seconds=60) == ("done", "a")
    now[0] += 10.0  # the grace is over: a join heard now is another warm-up
    assert await claims.states([("p", "g1")]) == ["gone"]
    assert await claim("p", "g1", "d", can_warm=True, ttl_seconds=60) == ("claimed", "d")
    # a replaced pod (new generation) is claimed anew; the claimant's own rejoin too
    assert await claim("p", "g2", "b", can_warm=True, ttl_seconds=60) == ("claimed", "b")
    assert await claim("p", "g2", "b", can_warm=True, ttl_seconds=60) == ("claimed", "b")
    now[0] += 60.0  # a claimant that died: its claim expires
    assert await claims.states([("p", "g2")]) == ["gone"]


@pytest.mark.parametrize(
    ("shared", "backend", "enabled", "on"),
    [
        (None, "redis", True, True),
        (None, "memory", True, False),
        (False, "redis", True, False),
        (True, "redis", True, True),
        (None, "redis", False, False),  # warm-up off: nothing to share
    ],
)
def test_sharing_is_on_by_default_exactly_with_the_redis_directory(shared, backend, enabled, on):
    config = make_config(
        2,
        directory={"backend": backend},
        warmup={"enabled": enabled, "shared": shared},
    )
    assert config.warmup_sharing_enabled is on


def test_sharing_forced_on_needs_the_redis_directory():
    with pytest.raises(ValueError, match=r"warmup\.shared: true needs"):
        make_config(2, warmup={"shared": True})
    assert isinstance(make_config(2, warmup=WarmupConfig(shared=False)), RouterConfig)
