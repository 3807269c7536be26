from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvgate.sim.des import (
    DESFleet,
    FleetDriver,
    PodState,
    RequestRecord,
    TraceRequest,
    routed_by,
)
from kvgate.sim.engine import EngineConfig
from kvgate.sim.profile import H100_LLAMA3_8B
from kvgate.sim.request import SimRequest


def _round_robin() -> FleetDriver:
    counter = iter(range(1 << 62))
    return routed_by(lambda request, pods, now: next(counter) % len(pods))


def _least_loaded_fn(request: TraceRequest, pods: Sequence[PodState], now: float) -> int:
    return min(pods, key=lambda p: (p.num_running + p.num_waiting, p.index)).index


def _longest_prefix_fn(request: TraceRequest, pods: Sequence[PodState], now: float) -> int:
    return min(
        pods, key=lambda p: (-p.cached_prefix_tokens, p.num_running + p.num_waiting, p.index)
    ).index


least_loaded = routed_by(_least_loaded_fn)
longest_prefix = routed_by(_longest_prefix_fn)


def _fleet(pods: int = 4, **overrides: object) -> DESFleet:
    config = EngineConfig(**overrides)  # type: ignore[arg-type]
    return DESFleet(pods, config, H100_LLAMA3_8B)


def _trace(n: int, prefixes: int, gap: float = 0.05) -> list[TraceRequest]:
    """``n`` requests cycling over ``prefixes`` shared 1024-token prefixes plus a unique tail."""
    return [
        TraceRequest(
            request_id=f"r{i}",
            arrival_time=i * gap,
            prompt_token_ids=[100_000 * (i % prefixes + 1) + t for t in range(1024)]
            + [7_000_000 + i] * 20,
            max_tokens=8,
        )
        for i in range(n)
    ]


def test_prefix_aware_routing_hits_the_cache_and_beats_round_robin() -> None:
    trace = _trace(64, prefixes=5)  # 5 prefixes over 4 pods: round robin keeps missing
    rr = _fleet().run(trace, _round_robin())
    lp = _fleet().run(trace, longest_prefix)
    assert len(rr.records) == len(lp.records) == 64

    def hit_rate(records: Sequence[RequestRecord]) -> float:
        return sum(r.cached_tokens for r in records) / sum(r.prompt_tokens for r in records)

    assert hit_rate(lp.records) > 0.85
    assert hit_rate(lp.records) > hit_rate(rr.records)
    mean = lambda rs: sum(r.ttft for r in rs) / len(rs)  # noqa: E731
    assert mean(lp.records) < mean(rr.records)
    # Every request of one prefix went to the same pod.
    pods_by_prefix: dict[int, set[int]] = {}
    for rec in lp.records:
        pods_by_prefix.setdefault(int(rec.request_id[1:]) % 5, set()).add(rec.pod)
    assert all(len(p) == 1 for p in pods_by_prefix.values())


def test_a_one_pod_fleet_matches_the_engine_driven_alone() -> None:
    trace = _trace(20, prefixes=3, gap=0.01)
    fleet = _fleet(pods=1, max_num_batched_tokens=2048)
    records = {r.request_id: r for r in fleet.run(trace, least_loaded).records}
    engine = _fleet(pods=1, max_num_batched_tokens=2048).engines[0]
    reqs = [
        engine.add_request(t.request_id, list(t.prompt_token_ids), t.max_tokens, t.arrival_time)
        for t in trace
    ]
    now = 0.0
    # The same stepping rule, interleaving arrivals by hand: arrivals are known in advance here.
    engine.run_until_idle(now)
    for req in reqs:
        assert req.first_token_time is not None
        assert records[req.request_id].ttft == pytest.approx(
            req.first_token_time - req.arrival_time, rel=1e-12
        )


def test_policy_sees_load_and_prefix_hits() -> None:
    seen: list[list[tuple[int, int, int]]] = []

    def spy(request: TraceRequest, pods: Sequence[PodState], now: float) -> int:
        seen.append([(p.cached_prefix_tokens, p.num_running + p.num_waiting, p.block_size)
                     for p in pods])  # fmt: skip
        assert now == request.arrival_time
        return 1

    trace = _trace(3, prefixes=1, gap=0.0)
    _fleet(pods=2).run(trace, routed_by(spy))
    assert seen[0] == [(0, 0, 16), (0, 0, 16)]
    assert seen[1][1][1] == 1 and seen[1][1][0] == 0  # queued on pod 1, not computed yet
    assert seen[1][0] == (0, 0, 16)


def test_bad_traces_and_policies_fail_loudly() -> None:
    trace = _trace(3, prefixes=1)
    with pytest.raises(ValueError, match="sorted"):
        _fleet().run(list(reversed(trace)), least_loaded)
    with pytest.raises(ValueError, match="returned pod 9"):
        _fleet().run(trace, routed_by(lambda r, p, n: 9))


def test_requests_the_engine_refuses_are_reported() -> None:
    trace = [
        TraceRequest("ok", 0.0, [1] * 100, 4),
        TraceRequest("too-long", 0.1, [1] * 5000, 4),
    ]
    result = _fleet(pods=1, max_model_len=4096).run(trace, least_loaded)
    assert [r.request_id for r in result.records] == ["ok"]
    assert result.rejected == ["too-long"]


class _Sessions(FleetDriver):
    """Closed loop: each finished request is followed by the next turn after a think time;
    every hook is seen at the time a client would see it."""

    tick_interval_s = 0.5

    def __init__(self) -> None:
        self.first_tokens: dict[str, float] = {}
        self.events = 0
        self.ticks: list[float] = []

    def route(self, request: TraceRequest, fleet: DESFleet, now: float) -> int:
        return int(request.request_id.split("-")[0][1:]) % len(fleet.engines)

    def first_token(self, request: SimRequest, pod: int, now: float) -> None:
        assert now == request.first_token_time
        self.first_tokens[request.request_id] = now

    def finished(self, request: SimRequest, pod: int, now: float) -> list[TraceRequest]:
        assert now == request.finish_time
        session, turn = request.request_id.split("-")
        if int(turn) >= 2:
            return []
        history = list(request.all_token_ids)
        nxt = f"{session}-{int(turn) + 1}"
        return [TraceRequest(nxt, now + 0.25, [*history, *range(500, 532)], 4)]

    def kv_events(self, pod: int, events: Sequence[object], now: float) -> None:
        self.events += len(events)

    def tick(self, fleet: DESFleet, now: float) -> list[TraceRequest]:
        self.ticks.append(now)
        return []


def test_closed_loop_sessions_and_every_hook() -> None:
    driver = _Sessions()
    trace = [TraceRequest(f"s{i}-0", i * 0.01, list(range(i * 1000, i * 1000 + 300)), 4)
             for i in range(4)]  # fmt: skip
    result = _fleet(pods=2).run(trace, driver)
    ids = sorted(r.request_id for r in result.records)
    assert ids == sorted(f"s{i}-{t}" for i in range(4) for t in range(3))
    assert set(driver.first_tokens) == set(ids)
    by_id = {r.request_id: r for r in result.records}
    # Each next turn arrives think time after the previous turn's answer, and hits its history.
    for i in range(4):
        for t in (1, 2):
            prev, cur = by_id[f"s{i}-{t - 1}"], by_id[f"s{i}-{t}"]
            assert cur.arrival_time == pytest.approx(prev.arrival_time + prev.e2e + 0.25)
            assert cur.cached_tokens >= prev.prompt_tokens // 16 * 16 - 16
    assert driver.events > 0
    assert driver.ticks[:2] == [0.0, 0.5]
    assert driver.ticks[-1] <= result.end_time + 0.5
