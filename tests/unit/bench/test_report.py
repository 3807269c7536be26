"""Report math: percentiles, per-target summaries, the ideal hit-rate bound, the table."""

import json
import math

import pytest

from kvgate.bench.records import GeneratorHealth, RequestRecord
from kvgate.bench.report import (
    BenchReport,
    arrival_order,
    ideal_hit_rate,
    markdown_table,
    percentile,
    summarize,
)
from kvgate.bench.workload import completion_request


def _record(
    rid,
    sent,
    first,
    end,
    prompt=100,
    cached=0,
    out=10,
    status=200,
    endpoint=None,
    error=None,
    request_class="online",
):
    return RequestRecord(
        request_id=rid,
        request_class=request_class,
        session_id=None,
        scheduled_s=sent,
        sent_s=sent,
        first_byte_s=first,
        end_s=end,
        status=status,
        error=error,
        endpoint=endpoint,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=out,
    )


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 99) == pytest.approx(3.97)
    assert math.isnan(percentile([], 50))


def test_summarize_counts_only_completed_requests():
    records = [
        _record("a", 0.0, 0.5, 2.0, prompt=100, cached=50, out=11, endpoint="p1"),
        _record("b", 1.0, 1.1, 3.0, prompt=300, cached=0, out=21, endpoint="p2"),
        _record("c", 1.0, None, 1.2, status=503, error="HTTP 503"),
    ]
    s = summarize("t", records, GeneratorHealth(max_send_lag_s=0.01))
    assert (s.requests, s.completed, s.errors) == (3, 2, 1)
    assert s.ttft_mean_s == pytest.approx((0.5 + 0.1) / 2)
    assert s.e2e_mean_s == pytest.approx((2.0 + 2.0) / 2)
    assert s.tpot_mean_s == pytest.approx((1.5 / 10 + 1.9 / 20) / 2)
    assert s.makespan_s == pytest.approx(3.0)
    assert s.throughput_rps == pytest.approx(2 / 3)
    assert s.output_tps == pytest.approx(32 / 3)
    assert s.hit_rate == pytest.approx(50 / 400)
    assert s.pods_used == {"p1": 1, "p2": 1}
    assert s.generator["max_send_lag_s"] == 0.01


def test_summary_of_nothing_is_nan_not_a_crash():
    s = summarize("t", [_record("x", 0, None, None, status=None, error="refused")])
    assert s.completed == 0 and s.errors == 1 and math.isnan(s.ttft_mean_s)
    assert s.to_json()["ttft_mean_s"] is None


def test_ideal_bound_counts_leading_blocks_seen_before():
    block = 4
    a = completion_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], 1, 0)
    b = completion_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 10], 1, 1)  # shares 2 blocks
    c = completion_request("c", [9, 2, 3, 4, 5, 6, 7, 8], 1, 2)  # first block differs: no hit
    d = completion_request(
        "d", [1, 2, 3, 4, 5, 6, 7, 8], 1, 3
    )  # full prompt cached: last block recomputed
    assert ideal_hit_rate([a], block) == 0.0
    assert ideal_hit_rate([a, b], block) == pytest.approx(8 / 18)
    assert ideal_hit_rate([a, b, c], block) == pytest.approx(8 / 26)
    assert ideal_hit_rate([a, d], block) == pytest.approx(4 / 17)
    assert math.isnan(ideal_hit_rate([], block))


def test_arrival_order_follows_the_run():
    a = completion_request("a", [1], 1, 0)
    b = completion_request("b", [2], 1, 1)
    recs = [_record("b", 0.1, 0.2, 0.3), _record("a", 0.5, 0.6, 0.7)]
    assert [r.request_id for r in arrival_order([a, b], recs)] == ["b", "a"]
    # A prompt no pod serves (400: over max_model_len) is no hit any cache could make.
    too_long = completion_request("c", [3], 1, 2)
    refused = RequestRecord("c", "online", None, 0.8, 0.8, end_s=0.8, status=400, error="long")
    assert [r.request_id for r in arrival_order([a, b, too_long], [*recs, refused])] == ["b", "a"]


def test_report_json_and_table(tmp_path):
    base = summarize("round-robin", [_record("a", 0, 1.0, 2.0, cached=0)])
    fast = summarize("kvgate", [_record("a", 0, 0.25, 1.0, cached=80)])
    report = BenchReport("w", "desc", 2, 0.9, {"round-robin": base, "kvgate": fast})
    path = report.write(tmp_path)
    data = json.loads(path.read_text())
    for field in (
        "ttft_mean_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "e2e_mean_s",
        "throughput_rps",
        "output_tps",
        "hit_rate",
        "errors",
    ):
        assert field in data["targets"]["kvgate"]
    assert data["ideal_hit_rate"] == 0.9
    table = markdown_table(report)
    assert "| kvgate | 0.250 |" in table
    assert "mean TTFT 0.25x round-robin's" in table
    assert (tmp_path / "report.md").read_text().startswith("Workload `w`")


def test_online_and_batch_are_summarised_apart_where_both_ran(tmp_path):
    records = [
        _record("o1", 0.0, 0.02, 1.0, prompt=100, cached=90),
        _record("o2", 1.0, 1.04, 2.0, prompt=100, cached=90),
        _record("b1", 0.0, 3.0, 9.0, prompt=1000, request_class="batch"),
        _record("b2", 0.5, None, 0.6, status=429, error="queue_full", request_class="batch"),
    ]
    s = summarize("kvgate", records)
    online, batch = s.classes["online"], s.classes["batch"]
    assert (online["requests"], online["errors"], batch["requests"], batch["errors"]) == (
        2,
        0,
        2,
        1,
    )
    assert online["ttft_mean_s"] == pytest.approx(0.03)
    assert online["hit_rate"] == pytest.approx(0.9)
    assert (batch["ttft_mean_s"], batch["e2e_mean_s"], batch["hit_rate"]) == (3.0, 9.0, 0.0)
    assert s.ttft_mean_s == pytest.approx(3.06 / 3)  # the whole run mixes both
    report = BenchReport("mixed", "desc", 2, 0.5, {"kvgate": s})
    data = json.loads(report.write(tmp_path).read_text())
    assert data["targets"]["kvgate"]["classes"]["batch"]["ttft_p99_s"] == 3.0
    assert "| kvgate | batch | 2 | 3.000 | 3.000 | 9.000 | 0.00 | 1 |" in markdown_table(report)
    # One class only: nothing apart, no second table.
    alone = summarize("kvgate", records[:2])
    assert alone.classes == {}
    assert "| class |" not in markdown_table(BenchReport("w", "d", 2, 0.5, {"kvgate": alone}))
