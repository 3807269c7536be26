"""`kvgate bench run` end to end over real HTTP: a real simulated fleet and real router processes.

A tiny replay of the sample Mooncake trace (24 requests, a few seconds per target) through round
robin and kvgate; then report.json must hold every documented field for each target, the pods'
own usage must show prefix hits, and the plots must exist.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.bench.targets import sglang_router_binary

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "bench" / "mooncake_sample.jsonl"
FIELDS = (
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_mean_s",
    "throughput_rps",
    "output_tps",
    "hit_rate",
    "errors",
)


def _bench(out: Path, targets: str, *extra: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvgate.cli",
            "bench",
            "run",
            "--trace",
            str(SAMPLE),
            "--speedup",
            "4",
            "--pods",
            "2",
            "--targets",
            targets,
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def _failures(out: Path, name: str) -> str:
    """What went wrong for target ``name``: its first failed records and its router's log tail."""
    records = [
        json.loads(line) for line in (out / f"records-{name}.jsonl").read_text().splitlines()
    ]
    failed = [r for r in records if r["error"] is not None or r["status"] != 200][:3]
    log = out / "logs" / f"{name}.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    return f"{name}: {failed}\n{tail}"


def test_bench_run_replays_a_trace_through_two_routers(tmp_path: Path):
    report = _bench(tmp_path, "round-robin,kvgate")
    assert report["workload"] == "mooncake_sample" and report["pods"] == 2
    assert 0 < report["ideal_hit_rate"] < 1
    # the finite bound: one LRU cache as large as both pods' KV (read from their /metrics)
    assert report["kv_capacity_blocks"] == 2 * (24_626 - 1)
    assert 0 < report["finite_hit_rate"] <= report["ideal_hit_rate"]
    assert set(report["targets"]) == {"round-robin", "kvgate"}
    for name, target in report["targets"].items():
        for field in FIELDS:
            assert field in target, (name, field)
        assert target["errors"] == 0 and target["completed"] == 24, _failures(tmp_path, name)
        assert 0 < target["ttft_p50_s"] <= target["ttft_p99_s"]
        assert target["ttft_mean_s"] <= target["e2e_mean_s"]
        assert target["throughput_rps"] > 0 and target["output_tps"] > 0
        assert target["prompt_tokens"] > 24 * 500  # the pods' usage, not the client's guess
        assert 0 <= target["hit_rate"] <= report["ideal_hit_rate"] + 1e-9
        assert len(target["pods_used"]) == 2  # x-kvgate-endpoint was read
    # kvgate follows shared prefixes; round robin mostly does not
    assert report["targets"]["kvgate"]["hit_rate"] > report["targets"]["round-robin"]["hit_rate"]
    for name in ("ttft_cdf.png", "hit_rate.png", "pod_load.png", "report.md"):
        assert (tmp_path / name).stat().st_size > 0
    lines = (tmp_path / "records-kvgate.jsonl").read_text().splitlines()
    assert len(lines) == 24


def test_bench_run_shares_the_schedule_between_several_client_processes(tmp_path: Path):
    report = _bench(tmp_path, "kvgate", "--clients", "3")
    assert report["settings"]["clients"] == 3
    target = report["targets"]["kvgate"]
    assert target["errors"] == 0 and target["completed"] == 24, _failures(tmp_path, "kvgate")
    records = [
        json.loads(line) for line in (tmp_path / "records-kvgate.jsonl").read_text().splitlines()
    ]
    assert len({r["request_id"] for r in records}) == 24
    assert {r["client"] for r in records} == {0, 1, 2}  # each process sent its share
    # one clock: every request left within a few tens of ms of its schedule, whichever client
    # process sent it (send lag would show a client that started late)
    assert max(r["sent_s"] - r["scheduled_s"] for r in records) < 0.5
    assert target["generator"]["late_sends"] <= 2


PEERS = "llm-d-sticky,gie-weighted,dynamo-kv,load-aware,aibrix-prefix"


def test_bench_run_serves_the_peer_policies_through_real_routers(tmp_path: Path):
    # each re-implemented peer is a `kvgate router --policy NAME` process like any policy
    report = _bench(tmp_path, PEERS)
    assert set(report["targets"]) == set(PEERS.split(","))
    for name, target in report["targets"].items():
        assert target["errors"] == 0 and target["completed"] == 24, _failures(tmp_path, name)
        assert len(target["pods_used"]) == 2, name  # the router answered with its choice
        assert 0 < target["hit_rate"] <= report["ideal_hit_rate"] + 1e-9, name


@pytest.mark.skipif(
    sglang_router_binary() is None, reason="sglang-router (peers extra) not installed"
)
def test_bench_run_drives_the_sglang_router(tmp_path: Path):
    report = _bench(tmp_path, "sglang-cache-aware")
    target = report["targets"]["sglang-cache-aware"]
    assert target["errors"] == 0 and target["completed"] == 24, _failures(
        tmp_path, "sglang-cache-aware"
    )
    assert target["hit_rate"] > 0
