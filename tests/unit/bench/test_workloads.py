"""Workload generators: the documented shapes, determinism, and scaling overrides."""

import itertools
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvgate.bench.agent_sessions import AgentSessionParams, build_agent_sessions
from kvgate.bench.shared_prefix import LLMD_PRECISE_PREFIX, SGLANG_GSP
from kvgate.bench.workload import token_text
from kvgate.bench.workloads import (
    UnknownWorkloadError,
    build_workload,
    parse_overrides,
)

SWE_AGENT = Path(__file__).resolve().parents[4] / "shared" / "data" / "swe-agent"


def test_each_token_id_is_one_four_character_word():
    assert token_text([0, 1, 36, 46656 + 1295]) == "000 001 010 0zz "
    assert token_text([]) == ""


def test_published_shared_prefix_profiles():
    assert (SGLANG_GSP.num_groups, SGLANG_GSP.prompts_per_group) == (64, 16)
    assert (SGLANG_GSP.system_prompt_len, SGLANG_GSP.question_len, SGLANG_GSP.output_len) == (
        2048,
        128,
        256,
    )
    assert (LLMD_PRECISE_PREFIX.num_groups, LLMD_PRECISE_PREFIX.prompts_per_group) == (150, 5)
    assert LLMD_PRECISE_PREFIX.system_prompt_len == 6000
    assert (LLMD_PRECISE_PREFIX.question_len, LLMD_PRECISE_PREFIX.output_len) == (1200, 1000)


def test_shared_prefix_groups_share_exactly_the_system_prompt():
    w = build_workload(
        "shared-prefix",
        {
            "num_groups": "3",
            "prompts_per_group": "4",
            "system_prompt_len": "64",
            "question_len": "8",
        },
    )
    assert w.size == 12
    by_group: dict[str, list[tuple[int, ...]]] = {}
    for r in w.requests:
        by_group.setdefault(r.request_id.split("-")[0], []).append(tuple(r.prefix_units))
        assert len(r.prefix_units) == 72
        assert r.body["prompt"] == token_text(r.prefix_units)
        assert r.body["max_tokens"] == 256
    assert len(by_group) == 3
    prefixes = {units[:64] for group in by_group.values() for units in group}
    assert len(prefixes) == 3  # one per group
    for group in by_group.values():
        assert len({units[64:] for units in group}) == 4  # distinct questions
    arrivals = [r.arrival_s for r in w.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0


def test_precise_prefix_preset_and_overrides():
    w = build_workload("precise-prefix", {"num_groups": "2", "rate_rps": "100"})
    assert w.size == 2 * 5
    assert all(len(r.prefix_units) == 7200 and r.max_tokens == 1000 for r in w.requests)


def test_workloads_are_deterministic_for_a_seed():
    a = build_workload("hot-prefix", {"num_requests": "20", "seed": "3"})
    b = build_workload("hot-prefix", {"num_requests": "20", "seed": "3"})
    c = build_workload("hot-prefix", {"num_requests": "20", "seed": "4"})
    assert a.requests == b.requests
    assert a.requests != c.requests


def test_hot_prefix_puts_most_requests_on_one_prefix():
    w = build_workload(
        "hot-prefix", {"num_requests": "400", "prefix_len": "32", "question_len": "4"}
    )
    counts: dict[tuple[int, ...], int] = {}
    for r in w.requests:
        head = tuple(r.prefix_units[:32])
        counts[head] = counts.get(head, 0) + 1
    hottest = max(counts.values())
    assert 0.85 * 400 < hottest < 0.95 * 400


def test_mixed_marks_batch_requests_and_keeps_arrival_order():
    w = build_workload("mixed", {"duration_s": "10", "batch_document_len": "100"})
    classes = {r.request_class for r in w.requests}
    assert classes == {"online", "batch"}
    batch = [r for r in w.requests if r.request_class == "batch"]
    assert all(len(r.prefix_units) == 512 + 100 for r in batch)
    assert [r.arrival_s for r in w.requests] == sorted(r.arrival_s for r in w.requests)


def test_unknown_workload_and_bad_params_fail_loudly():
    with pytest.raises(UnknownWorkloadError):
        build_workload("nope")
    with pytest.raises(ValidationError):
        build_workload("shared-prefix", {"no_such_param": "1"})
    with pytest.raises(ValueError):
        parse_overrides(["novalue"])
    assert parse_overrides(["a=1", "b = x"]) == {"a": "1", "b": "x"}


def test_agent_sessions_resend_the_growing_history():
    w = build_agent_sessions(AgentSessionParams(num_sessions=3, max_turns=4, think_time_s=1.0))
    assert len(w.sessions) == 3 and not w.requests
    for session in w.sessions:
        turns = session.turns
        assert 1 <= len(turns) <= 4
        for earlier, later in itertools.pairwise(turns):
            before = earlier.body["messages"]
            after = later.body["messages"]
            assert after[: len(before)] == before and len(after) > len(before)
            shared = len(earlier.prefix_units) - 1  # the last, partial chunk may differ
            assert later.prefix_units[:shared] == earlier.prefix_units[:shared]
        assert turns[0].body["messages"][0]["role"] == "system"
        assert all(t.session_id == session.session_id for t in turns)
        assert all(t.think_time_s >= 0 for t in turns)
    starts = [s.start_s for s in w.sessions]
    assert starts == sorted(starts)
    # sessions differ in their task but share the system prompt
    firsts = [s.turns[0].body["messages"] for s in w.sessions]
    assert len({m[1]["content"] for m in firsts}) == 3


def test_agent_sessions_scale_beyond_the_trajectory_count_and_use_a_tokenizer():
    calls = []

    def tokenize(messages):
        calls.append(len(messages))
        return [len(m["content"]) for m in messages]

    w = build_agent_sessions(
        AgentSessionParams(num_sessions=40, max_turns=1, ramp_s=5), tokenize=tokenize
    )
    assert len(w.sessions) == 40
    assert len({s.turns[0].body["messages"][1]["content"] for s in w.sessions}) == 40
    assert calls and w.sessions[0].turns[0].prefix_units == tuple(
        len(m["content"]) for m in w.sessions[0].turns[0].body["messages"]
    )


@pytest.mark.skipif(not SWE_AGENT.is_dir(), reason="shared trajectories not on this machine")
def test_agent_sessions_read_traj_files_like_the_bundled_copy():
    from_files = build_agent_sessions(
        AgentSessionParams(num_sessions=5, max_turns=2, trajectory_dir=str(SWE_AGENT))
    )
    bundled = build_agent_sessions(AgentSessionParams(num_sessions=5, max_turns=2))
    assert from_files.sessions == bundled.sessions


def test_token_text_is_one_simulator_token_per_id():
    from kvgate.sim.text import ChunkCodec

    ids = [1000, 1001, 31999, 1000]
    text = token_text(ids)
    assert len(text) == 4 * len(ids)
    encoded = ChunkCodec().encode(text)
    assert len(encoded) == 4 and encoded[0] == encoded[3] and len(set(encoded[:3])) == 3
    assert token_text([5, 6]) == token_text([5]) + token_text([6])


def test_completions_api_sends_the_text_the_pod_would_render():
    from kvgate.bench.agent_sessions import render_chat_text
    from kvgate.bench.bench_command import chat_tokenizer
    from kvgate.sim.text import ChunkCodec

    codec = ChunkCodec()
    params = AgentSessionParams(num_sessions=2, max_turns=2, api="completions")
    w = build_agent_sessions(params, tokenize=chat_tokenizer())
    chat = build_agent_sessions(
        params.model_copy(update={"api": "chat"}), tokenize=chat_tokenizer()
    )
    for session, chat_session in zip(w.sessions, chat.sessions, strict=True):
        for turn, chat_turn in zip(session.turns, chat_session.turns, strict=True):
            assert turn.path == "/v1/completions" and "messages" not in turn.body
            assert turn.body["prompt"] == render_chat_text(chat_turn.body["messages"])
            assert codec.encode(turn.body["prompt"]) == chat_tokenizer()(chat_turn.body["messages"])
            assert turn.prefix_units == chat_turn.prefix_units


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_responses_and_messages_apis_send_what_the_pod_renders_as_the_chat_turn(api):
    """The simulated pod, reading the body as vLLM converts it, computes the chat turn's tokens."""
    from kvgate.bench.bench_command import chat_tokenizer
    from kvgate.sim.messages import parse_messages
    from kvgate.sim.responses import ResponseStore, parse_responses

    params = AgentSessionParams(num_sessions=2, max_turns=3, api=api)
    w = build_agent_sessions(params, tokenize=chat_tokenizer())
    chat = build_agent_sessions(
        params.model_copy(update={"api": "chat"}), tokenize=chat_tokenizer()
    )
    for session, chat_session in zip(w.sessions, chat.sessions, strict=True):
        for turn, chat_turn in zip(session.turns, chat_session.turns, strict=True):
            raw = json.dumps({**turn.body, "model": "m"}).encode()
            if api == "responses":
                assert turn.path == "/v1/responses" and turn.body["store"] is False
                assert turn.body["max_output_tokens"] == chat_turn.max_tokens
                parsed = parse_responses(raw, ResponseStore()).messages
            else:
                assert turn.path == "/v1/messages"
                assert turn.body["max_tokens"] == chat_turn.max_tokens
                parsed = parse_messages(raw).messages
            assert parsed == chat_turn.body["messages"]
            assert turn.prefix_units == chat_turn.prefix_units


def test_chained_responses_turns_send_what_came_since_the_answer_before():
    from kvgate.bench.workload import PREVIOUS_RESPONSE

    params = AgentSessionParams(num_sessions=1, max_turns=4, api="responses", chain_responses=True)
    plain = build_agent_sessions(params.model_copy(update={"chain_responses": False}))
    (session,) = build_agent_sessions(params).sessions
    first, *later = session.turns
    assert first.body["store"] is True and "previous_response_id" not in first.body
    assert first.body["input"] == plain.sessions[0].turns[0].body["input"]
    for turn, whole in zip(later, plain.sessions[0].turns[1:], strict=True):
        assert turn.body["previous_response_id"] == PREVIOUS_RESPONSE
        assert (
            turn.body["input"]
            and whole.body["input"][-len(turn.body["input"]) :] == turn.body["input"]
        )
        assert len(turn.body["input"]) < len(whole.body["input"])
