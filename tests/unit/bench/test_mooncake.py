"""Mooncake trace parsing and replay."""

import json
from pathlib import Path

import pytest

from kvgate.bench.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    TraceParams,
    body_tokenizer,
    build_trace_workload,
    infer_block_tokens,
    read_trace,
    read_trace_file,
)
from kvgate.bench.workload import CHAT_COMPLETIONS, COMPLETIONS
from kvgate.bench.workloads import build_trace

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "bench" / "mooncake_sample.jsonl"


def _rows(*lines: str):
    return read_trace(lines)


def test_sample_trace_parses():
    rows = read_trace_file(SAMPLE)
    assert len(rows) == 24
    assert all(r.input_length <= len(r.hash_ids) * MOONCAKE_BLOCK_TOKENS for r in rows)


def test_bad_lines_name_their_line_number():
    with pytest.raises(TraceError, match="trace:2"):
        _rows('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "{oops")
    with pytest.raises(TraceError, match="trace:1"):
        _rows('{"timestamp": 0, "output_length": 1}')
    with pytest.raises(TraceError):
        build_trace_workload([], TraceParams())


def test_what_publishers_write_is_read_or_refused_by_name(tmp_path: Path):
    """aiperf's rows may omit output_length, its converter writes 0, Windows editors add a
    BOM: each refused the whole trace. aiperf's nested multi_turn sessions and delta rows are
    not one request per row: refused by name (delta rows were replayed without their
    history)."""
    rows = _rows(
        '{"timestamp": 0, "input_length": 10, "hash_ids": [1]}',
        '{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}',
    )
    assert [r.answer_tokens for r in rows] == [1, 1]
    workload = build_trace_workload(rows, TraceParams(block_tokens=16))
    assert [r.max_tokens for r in workload.requests] == [1, 1]
    path = tmp_path / "bom.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1]}\n',
                    encoding="utf-8-sig")  # fmt: skip
    assert read_trace_file(path)[0].output_length == 3
    with pytest.raises(TraceError, match="multi_turn"):
        _rows('{"session_id": "s", "turns": [{"text": "hi"}]}')
    with pytest.raises(TraceError, match="message_mode 'delta'"):
        _rows('{"session_id": "s", "message_mode": "delta", "messages": [{"role": "user"}]}')


def test_shared_hash_ids_mean_shared_tokens_and_nothing_else():
    rows = _rows(
        '{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [7, 8, 9]}',
        '{"timestamp": 1000, "input_length": 1024, "output_length": 4, "hash_ids": [7, 5]}',
        "",
        '{"timestamp": 2000, "input_length": 2000, "output_length": 4, "hash_ids": [1]}',
    )
    w = build_trace_workload(rows, TraceParams())
    a, b, c = (r.prefix_units for r in w.requests)
    assert (len(a), len(b), len(c)) == (1100, 1024, 2000)
    assert a[:512] == b[:512]
    assert a[512:1024] != b[512:1024]
    assert c[:512] != a[:512]
    # a trace shorter than its input length is padded with tokens of its own
    again = build_trace_workload(rows, TraceParams())
    assert again.requests == w.requests
    other_seed = build_trace_workload(rows, TraceParams(seed=1))
    assert other_seed.requests[0].prefix_units != a


def test_speedup_jitter_and_limits():
    rows = read_trace_file(SAMPLE)
    plain = build_trace_workload(rows, TraceParams())
    fast = build_trace_workload(rows, TraceParams(speedup=4))
    first_ms = rows[0].timestamp
    assert plain.requests[-1].arrival_s == pytest.approx((rows[-1].timestamp - first_ms) / 1000)
    assert fast.requests[-1].arrival_s == pytest.approx(plain.requests[-1].arrival_s / 4)
    jittered = build_trace_workload(rows, TraceParams(jitter_s=0.05))
    deltas = sorted(j.arrival_s for j in jittered.requests)
    assert [r.arrival_s for r in jittered.requests] == deltas
    assert any(
        abs(j - p) > 0 for j, p in zip(deltas, (r.arrival_s for r in plain.requests), strict=True)
    )
    assert all(
        abs(j - p) <= 0.05 + 0.5
        for j, p in zip(deltas, (r.arrival_s for r in plain.requests), strict=True)
    )
    capped = build_trace_workload(
        rows, TraceParams(max_requests=5, max_input_len=600, max_output_len=8)
    )
    assert len(capped.requests) == 5
    assert all(len(r.prefix_units) <= 600 and r.max_tokens <= 8 for r in capped.requests)
    window = build_trace_workload(rows, TraceParams(max_duration_s=1.0))
    assert all(r.arrival_s <= 1.0 for r in window.requests) and len(window.requests) < 24


def test_build_trace_from_a_file_with_overrides():
    w = build_trace(SAMPLE, {"speedup": "2", "max_requests": "none"})
    assert w.name == "mooncake_sample" and w.size == 24


def test_a_later_window_replays_the_same_requests_on_its_own_clock():
    rows = read_trace_file(SAMPLE)
    whole = build_trace_workload(rows, TraceParams())
    window = build_trace_workload(rows, TraceParams(skip_requests=10, max_requests=5))
    assert [r.request_id for r in window.requests] == [f"t{i}" for i in range(10, 15)]
    assert window.requests[0].arrival_s == 0.0
    same = {r.request_id: r for r in whole.requests}
    start = (rows[10].timestamp - min(r.timestamp for r in rows)) / 1000
    for r in window.requests:
        assert r.prefix_units == same[r.request_id].prefix_units
        assert r.arrival_s == pytest.approx(same[r.request_id].arrival_s - start)
    with pytest.raises(TraceError, match="skips all 24 rows"):
        build_trace_workload(rows, TraceParams(skip_requests=24))


def test_the_block_size_of_the_hash_ids_is_read_from_the_trace():
    # 128-token blocks (a converted trace): rows sharing two ids share 256 tokens, no more
    rows = _rows(
        '{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [1, 2, 3]}',
        '{"timestamp": 5, "input_length": 380, "output_length": 4, "hash_ids": [1, 2, 4]}',
        '{"timestamp": 9, "input_length": 129, "output_length": 4, "hash_ids": [1, 5]}',
    )
    assert infer_block_tokens(rows) == 128
    a, b, c = (r.prefix_units for r in build_trace_workload(rows, TraceParams()).requests)
    assert a[:256] == b[:256] and a[256:300] != b[256:300]
    assert c[:128] == a[:128] and c[128] != a[128]
    assert "128-token hash ids" in build_trace_workload(rows, TraceParams()).description
    # said explicitly, it wins; Mooncake's own traces read as 512
    forced = build_trace_workload(rows, TraceParams(block_tokens=512)).requests
    assert forced[0].prefix_units[:300] == forced[1].prefix_units[:300]
    assert infer_block_tokens(read_trace_file(SAMPLE)) == MOONCAKE_BLOCK_TOKENS
    assert infer_block_tokens(_rows('{"timestamp": 0, "input_length": 9, "output_length": 1}')) == (
        MOONCAKE_BLOCK_TOKENS
    )


def test_a_bailian_trace_is_replayed_in_seconds_with_its_conversations_as_sessions():
    rows = _rows(
        '{"chat_id": 7, "parent_chat_id": 3, "timestamp": 60.0, "input_length": 40,'
        ' "output_length": 2, "hash_ids": [1, 2, 3], "type": "text", "turn": 2}',
        '{"chat_id": 9, "parent_chat_id": -1, "timestamp": 60.5, "input_length": 20,'
        ' "output_length": 2, "hash_ids": [8, 9], "type": "text", "turn": 1}',
        '{"chat_id": 11, "parent_chat_id": 7, "timestamp": 62.25, "input_length": 60,'
        ' "output_length": 2, "hash_ids": [1, 2, 3, 4], "type": "text", "turn": 3}',
        '{"chat_id": 12, "parent_chat_id": 11, "timestamp": 63.0, "input_length": 70,'
        ' "output_length": 2, "hash_ids": [1, 2, 3, 4, 5], "type": "text", "turn": 4}',
    )
    w = build_trace_workload(rows, TraceParams())
    assert [r.arrival_s for r in w.requests] == [0.0, 0.5, 2.25, 3.0]
    # a conversation is named by its first turn, held in the trace or not
    assert [r.session_id for r in w.requests] == ["chat-3", "chat-9", "chat-3", "chat-3"]
    first, second, third, fourth = (r.prefix_units for r in w.requests)
    assert third[:40] == first and fourth[:60] == third and second[:16] != first[:16]
    assert w.description.startswith("Bailian trace replay") and "16-token" in w.description
    # a window starts its clock at its own first row; its sessions keep their names
    window = build_trace_workload(rows, TraceParams(skip_requests=2))
    assert [(r.arrival_s, r.session_id) for r in window.requests] == [
        (0.0, "chat-3"),
        (0.75, "chat-3"),
    ]
    # read as Mooncake on request: milliseconds, no sessions
    as_mooncake = build_trace_workload(rows, TraceParams(trace_format="mooncake"))
    assert as_mooncake.requests[-1].arrival_s == pytest.approx(0.003)
    assert {r.session_id for r in as_mooncake.requests} == {None}


def test_a_conversation_that_loops_on_itself_still_ends():
    rows = _rows(
        '{"chat_id": 1, "parent_chat_id": 2, "timestamp": 0, "input_length": 16,'
        ' "output_length": 1, "hash_ids": [1]}',
        '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1, "input_length": 16,'
        ' "output_length": 1, "hash_ids": [1]}',
    )
    sessions = {r.session_id for r in build_trace_workload(rows, TraceParams()).requests}
    assert len(sessions) == 1


def test_a_rows_session_id_is_its_session():
    rows = _rows(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "session_id": "conv_0"}',
        '{"timestamp": 1, "input_length": 10, "output_length": 1, "session_id": 4}',
        '{"timestamp": 2, "input_length": 10, "output_length": 1}',
    )
    w = build_trace_workload(rows, TraceParams())
    assert [r.session_id for r in w.requests] == ["conv_0", "4", None]


def test_rows_without_timestamps_are_sessions_replayed_in_closed_loop():
    # aiperf / Dynamo multi-turn traces: a turn leaves `delay` ms after the answer before it
    rows = _rows(
        '{"session_id": "a", "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}',
        '{"session_id": "b", "timestamp": 2000, "input_length": 300, "output_length": 4,'
        ' "hash_ids": [9]}',
        '{"session_id": "a", "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3],'
        ' "delay": 500}',
        '{"input_length": 50, "output_length": 4, "hash_ids": [7]}',
        '{"session_id": "a", "input_length": 1200, "output_length": 4, "hash_ids": [1, 2, 3]}',
    )
    w = build_trace_workload(rows, TraceParams(speedup=2))
    assert w.requests == () and w.size == 5
    assert "5 rows in 3 closed-loop sessions" in w.description
    by_id = {s.session_id: s for s in w.sessions}
    a, b, alone = by_id["a"], by_id["b"], by_id["t3"]
    assert [t.request_id for t in a.turns] == ["t0", "t2", "t4"]
    assert [t.think_time_s for t in a.turns] == [0.25, 0.0, 0.0]  # 500 ms at speed-up 2
    assert (a.start_s, b.start_s, alone.start_s) == (0.0, 1.0, 0.0)
    assert {t.session_id for t in a.turns} == {"a"} and alone.turns[0].session_id is None
    assert a.turns[1].prefix_units[:600] == a.turns[0].prefix_units
    # max_requests takes the first rows; a session past max_duration_s is left out
    capped = build_trace_workload(rows, TraceParams(max_requests=3))
    assert [[t.request_id for t in s.turns] for s in capped.sessions] == [["t0", "t2"], ["t1"]]
    late = build_trace_workload(rows, TraceParams(max_duration_s=1.5))
    assert "b" not in {s.session_id for s in late.sessions} and late.size == 4


def test_a_closed_loop_trace_has_no_load_level_to_sweep(tmp_path: Path, capsys):
    from kvgate.cli import main

    trace = tmp_path / "sessions.jsonl"
    trace.write_text('{"session_id": "a", "input_length": 60, "output_length": 2}\n')
    assert main(["bench", "sweep", "--trace", str(trace), "--out", str(tmp_path / "o")]) == 2
    assert "replayed in closed loop" in capsys.readouterr().out


def test_a_window_reads_only_the_rows_it_replays(tmp_path: Path):
    lines = [
        f'{{"timestamp": {n}, "input_length": 10, "output_length": 1, "hash_ids": [{n}]}}'
        for n in range(50)
    ]
    trace = tmp_path / "big.jsonl"
    trace.write_text("\n".join([*lines, "{not json: never read}"]) + "\n")
    w = build_trace(trace, {"skip_requests": "10", "max_requests": "5"})
    assert [r.request_id for r in w.requests] == [f"t{n}" for n in range(10, 15)]
    assert len(read_trace_file(trace, max_rows=15)) == 15
    with pytest.raises(TraceError, match=r"big\.jsonl:51"):
        build_trace(trace, {"skip_requests": "10"})


SYSTEM = {"role": "system", "content": "You are a tool agent. " * 20}
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
FIRST = [SYSTEM, {"role": "user", "content": "find the bug"}]
SECOND = [*FIRST, {"role": "assistant", "content": "looking"}, {"role": "user", "content": "and?"}]
PROMPT_ROWS = [
    {"session_id": "a", "messages": FIRST, "tools": TOOLS, "output_length": 5},
    {"session_id": "a", "messages": SECOND, "tools": TOOLS, "output_length": 7, "delay": 250},
    {"session_id": "b", "text_input": "a plain completion prompt", "output_length": 3},
]


def test_rows_that_carry_their_prompt_are_sent_as_is():
    """aiperf's traces: `messages` (with `tools`) or `text_input` instead of token counts."""
    rows = read_trace(json.dumps(row) for row in PROMPT_ROWS)
    w = build_trace_workload(rows, TraceParams())
    tokenize = body_tokenizer()
    sessions = {s.session_id: s.turns for s in w.sessions}
    assert set(sessions) == {"a", "b"} and not w.requests
    first, second = sessions["a"]
    assert first.path == second.path == CHAT_COMPLETIONS
    assert first.body["messages"] == FIRST and first.body["tools"] == TOOLS
    assert first.max_tokens == first.body["max_tokens"] == 5 and second.max_tokens == 7
    assert list(first.prefix_units) == tokenize(
        CHAT_COMPLETIONS, {"messages": FIRST, "tools": TOOLS}
    )
    assert first.think_time_s == pytest.approx(0.25)  # the next row's delay
    # the later turn repeats the earlier one's prompt: the pods see the same leading tokens
    shared = len(first.prefix_units) - 3  # all but the earlier turn's assistant tag
    assert second.prefix_units[:shared] == first.prefix_units[:shared]
    [plain] = sessions["b"]
    assert plain.path == COMPLETIONS and plain.body["prompt"] == "a plain completion prompt"
    assert list(plain.prefix_units) == tokenize(COMPLETIONS, {"prompt": plain.body["prompt"]})
    assert "3 rows with their own prompts" in w.description
    assert "hash ids" not in w.description


def test_a_prompt_the_pods_would_refuse_names_its_row():
    bad = {"messages": [{"role": "user", "content": 42}], "output_length": 1}
    rows = read_trace([json.dumps(PROMPT_ROWS[2]), json.dumps(bad)])
    with pytest.raises(TraceError, match="trace row 2: message content"):
        build_trace_workload(rows, TraceParams())
