"""Mooncake trace parsing and replay."""

from pathlib import Path

import pytest

from kvgate.bench.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    TraceParams,
    build_trace_workload,
    read_trace,
    read_trace_file,
)
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
