"""The long-agent-sessions workload (three context modes) and `kvgate bench context`."""

from __future__ import annotations

import itertools

import pytest

from kvgate.bench.context_compare import compare_contexts, table
from kvgate.bench.des import run_des
from kvgate.bench.des_driver import RouterDriver
from kvgate.bench.long_agent import LongAgentParams, build_long_agent_sessions, tool_responses
from kvgate.bench.workloads import build_workload
from kvgate.prefix.cache_ops import token_prompt_history
from kvgate.sim.des import DESFleet


def _sessions(context: str, **overrides: object):  # type: ignore[no-untyped-def]
    params = LongAgentParams.model_validate(
        {"context": context, "num_sessions": 2, "turns": 80, **overrides}
    )
    return build_long_agent_sessions(params).sessions


def test_sessions_run_past_their_trajectory_and_every_mode_replays_the_same_turns() -> None:
    full, summarised, akv = (_sessions(mode) for mode in ("full", "summarise", "akv"))
    assert [len(s.turns) for s in full] == [len(s.turns) for s in akv]
    assert [len(s.turns) for s in full] == [len(s.turns) for s in summarised]
    assert all(len(s.turns) == 80 for s in full)  # longer than any bundled trajectory's start
    for session in full:
        for before, after in itertools.pairwise(session.turns):
            # the history is resent: each prompt extends the previous one (bar the generation
            # prompt) and carries no ops
            assert after.body["prompt"][: len(before.body["prompt"]) - 3] == list(
                before.prefix_units[:-3]
            )
            assert "cache" not in after.body


def test_akv_turns_carry_a_rolling_drop_that_extends_turn_by_turn() -> None:
    (session, *_rest) = _sessions("akv", keep_tool_responses=4)
    previous: dict[str, list[int]] = {}
    for turn in session.turns:
        cache = turn.body.get("cache")
        if cache is None:
            continue
        assert sum(cache["segments"]) <= len(turn.body["prompt"])
        drop = cache["drop"]
        assert {k: v for k, v in drop.items() if k in previous} == previous
        assert len(drop) == len(previous) + 1 or len(drop) == len(previous)
        history = token_prompt_history(cache, len(turn.body["prompt"]))
        assert history is not None and len(history.points) == len(drop)
        previous = drop


def test_summarise_compacts_old_tool_responses_at_the_threshold() -> None:
    (session, *_rest) = _sessions("summarise", summarise_at_tokens=8000, keep_tool_responses=2)
    (full, *_rest) = _sessions("full")
    sizes = [len(t.body["prompt"]) for t in session.turns]
    assert all(
        len(t.body["prompt"]) <= len(f.body["prompt"])
        for t, f in zip(session.turns, full.turns, strict=True)
    )
    assert sizes[-1] < len(full.turns[-1].body["prompt"])
    assert any(b < a for a, b in itertools.pairwise(sizes))  # a compaction shrank it
    assert tool_responses([{"role": "assistant", "content": ""}, {"role": "user", "content": ""}])


def test_context_comparison_runs_on_one_fleet() -> None:
    rows = compare_contexts({"num_sessions": 2, "turns": 30}, 2)
    by_mode = {r.context: r for r in rows}
    assert set(by_mode) == {"full", "summarise", "akv"}
    assert all(r.errors == 0 and r.turns == 60 for r in rows)
    # same prompts as full history; its dropped KV is freed and no longer read
    assert by_mode["akv"].prompt_tokens == by_mode["full"].prompt_tokens
    assert by_mode["akv"].peak_kv_usage < by_mode["full"].peak_kv_usage
    assert by_mode["akv"].tpot_mean_ms < by_mode["full"].tpot_mean_ms
    assert "| akv |" in table(rows)


def test_a_queued_turn_reaches_its_pod_with_its_cache_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flow control queues turns while the pod is saturated; a granted turn must still carry
    its AKV op history to the pod (it once arrived without, so the pod never dropped its KV)."""
    admitted: dict[str, bool] = {}
    original = DESFleet._admit

    def spy(self, item, driver, routed, result):  # type: ignore[no-untyped-def]
        pod = original(self, item, driver, routed, result)
        if pod is not None:
            admitted[item.request_id] = item.history is not None
        return pod

    monkeypatch.setattr(DESFleet, "_admit", spy)
    granted: list[str] = []
    released = RouterDriver.released

    def spy_released(self, now):  # type: ignore[no-untyped-def]
        out = released(self, now)
        granted.extend(r.request_id for r in out if r.request_id in self._granted)
        return out

    monkeypatch.setattr(RouterDriver, "released", spy_released)
    workload = build_workload(
        "long-agent-sessions",
        {"context": "akv", "num_sessions": 4, "turns": 30, "think_time_s": 0},
    )
    limits = {"flow_control": {"max_waiting_requests": 1}}
    result = run_des(workload, "kvgate", 1, cache_ops=True, config_update=limits)
    with_ops = {t.request_id for s in workload.sessions for t in s.turns if "cache" in t.body}
    assert with_ops and all(r.ok for r in result.records)
    assert set(granted) & with_ops  # the case under test happened: queued turns with ops
    assert {rid for rid, has in admitted.items() if has} == with_ops
