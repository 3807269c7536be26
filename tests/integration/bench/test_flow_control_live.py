"""The live two-tenant flow-control benchmark (`benchmarks/flow_control_live.py`) at a tiny size:
real `kvgate sim serve` pods, real `kvgate router --config` processes with tenants `short` and
`flood`, the bench's load generator sending their API keys. Both tenants must be served, the
report must hold every column of the table, and no process may outlive the run. Time scale 1
(the quickest) and no timing ratios: the machine is shared and noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from benchmarks.flow_control_live import LiveSettings, markdown, run_live_fairness

pytestmark = pytest.mark.integration

ROW_FIELDS = (
    "run",
    "short_ttft_p50_s",
    "short_ttft_p99_s",
    "p99_vs_alone",
    "short_served",
    "short_requests",
    "flood_served",
    "flood_429",
    "other_errors",
    "send_lag",
)


def _children() -> set[int]:
    """This process's live children (Linux /proc)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


async def test_both_tenants_are_served_live_and_every_process_stops(tmp_path: Path) -> None:
    before = _children()
    settings = LiveSettings(pods=2, flood_tokens=8192, duration_s=2.0, time_scale=1.0)
    result = await run_live_fairness(settings, tmp_path)
    assert _children() <= before  # the pods and routers were stopped

    report = json.loads(json.dumps(result.to_json()))
    alone, flooded = report["rows"]
    for row in (alone, flooded):
        for name in ROW_FIELDS:
            assert name in row, (row["run"], name)
        assert row["short_served"] == row["short_requests"] == 20  # 10 req/s for 2 s
        assert 0 < row["short_ttft_p50_s"] <= row["short_ttft_p99_s"]
        assert row["other_errors"] == 0
        assert {"max_send_lag_s", "mean_send_lag_s", "late_sends"} <= set(row["send_lag"])
    assert alone["flood_served"] is None and alone["p99_vs_alone"] == 1.0
    # The flood (2x the 2 pods' prefill capacity) was served, at least in part; what the queue
    # could not start in time is a 429, nothing else.
    assert report["flood_requests"] == flooded["flood_served"] + flooded["flood_429"] > 0
    assert flooded["flood_served"] > 0
    # Each run's router knew both tenants by their keys, with flow control on.
    for index in (0, 1):
        config = yaml.safe_load((tmp_path / f"router-{index}.yaml").read_text())
        tenants = {t["name"]: t["api_keys"] for t in config["tenants"]["tenants"]}
        assert tenants == {"short": [{"value": "k-short"}], "flood": [{"value": "k-flood"}]}
        assert config["flow_control"]["enabled"] is True
    table = markdown(result)
    assert "| short alone |" in table and "| with flood, flow control |" in table
    assert "send lag" in table
