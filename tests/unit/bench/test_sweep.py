"""`kvgate bench sweep`: load levels as shares of round robin's capacity."""

import json
from pathlib import Path

import pytest

from kvgate.bench.capacity import fleet_capacity
from kvgate.bench.sweep import sweep, sweep_table, workload_at
from kvgate.bench.workloads import build_workload

SMALL = {"num_groups": "3", "prompts_per_group": "4", "system_prompt_len": "256"}
TRACE = Path(__file__).resolve().parents[2] / "data" / "bench" / "mooncake_sample.jsonl"


def test_a_level_sets_the_arrival_rate_to_that_share_of_capacity() -> None:
    capacity = fleet_capacity(build_workload("shared-prefix", SMALL), 2).requests_per_s
    half, cap = workload_at("shared-prefix", None, SMALL, 0.5, 2)
    assert cap == pytest.approx(capacity)
    assert half.params["rate_rps"] == pytest.approx(0.5 * capacity)


def test_mixed_scales_online_and_batch_together() -> None:
    w, cap = workload_at("mixed", None, {"duration_s": "5"}, 1.0, 2)
    online, batch = w.params["online_rate_rps"], w.params["batch_rate_rps"]
    assert online + batch == pytest.approx(cap)
    assert online / batch == pytest.approx(6.0)


def test_closed_loop_workloads_have_no_level() -> None:
    with pytest.raises(ValueError, match="no arrival rate"):
        workload_at("agent-sessions", None, {"num_sessions": "2"}, 1.0, 2)


@pytest.mark.skipif(not TRACE.exists(), reason="no sample trace")
def test_a_trace_is_sped_up_to_the_level() -> None:
    slow, _ = workload_at(None, TRACE, {}, 0.5, 2)
    fast, _ = workload_at(None, TRACE, {}, 1.0, 2)
    last = [max(r.arrival_s for r in w.requests) for w in (slow, fast)]
    assert last[0] == pytest.approx(2 * last[1], rel=1e-6)


def test_every_level_and_target_is_reported() -> None:
    results = sweep("shared-prefix", None, SMALL, [0.5, 1.3], 2, ["round-robin", "kvgate"])
    assert [level for level, _ in results] == [0.5, 1.3]
    table = sweep_table(results)
    assert table.count("| kvgate |") == 2 and table.count("| round-robin |") == 2
    header, rule, *rows = table.splitlines()
    assert "decodes per prefill step" in header
    assert all(row.count("|") == rule.count("|") for row in rows)


def test_several_seeds_give_their_mean_and_range() -> None:
    results = sweep("shared-prefix", None, SMALL, [1.3], 2, ["kvgate"], seeds=[0, 1, 2])
    reports = results[0][1]
    assert len(reports) == 3
    p99 = [r.targets["kvgate"].ttft_p99_s for r in reports]
    row = next(line for line in sweep_table(results).splitlines() if "| kvgate |" in line)
    cells = [c.strip() for c in row.split("|")]
    assert cells[4] == f"{sum(p99) / 3:.3f} ({min(p99):.3f}-{max(p99):.3f})"


def test_the_command_writes_a_report_per_level_and_seed(tmp_path: Path) -> None:
    from kvgate.cli import main

    out = tmp_path / "sweep"
    args = ["bench", "sweep", "--workload", "shared-prefix", "--pods", "2", "--levels", "1",
            "--targets", "kvgate", "--seed", "3,4", "--out", str(out)]  # fmt: skip
    for key, value in SMALL.items():
        args += ["--param", f"{key}={value}"]
    assert main(args) == 0
    assert (out / "load-1" / "seed-3" / "report.json").exists()
    assert (out / "load-1" / "seed-4" / "report.json").exists()
    assert "| kvgate |" in (out / "sweep.md").read_text()


def test_several_workload_seeds_are_several_draws_of_the_workload() -> None:
    results = sweep(
        "shared-prefix", None, SMALL, [1.0], 2, ["round-robin"], seeds=[0, 1], workload_seeds=[5, 6]
    )
    reports = results[0][1]
    assert [(r.settings["workload_seed"], r.settings["seed"]) for r in reports] == [
        (5, 0), (5, 1), (6, 0), (6, 1),
    ]  # fmt: skip
    drawn = [build_workload("shared-prefix", {**SMALL, "seed": s}) for s in (5, 6)]
    assert [r.prefix_units for r in drawn[0].requests] != [
        r.prefix_units for r in drawn[1].requests
    ]
    assert [r.settings["workload_params"]["seed"] for r in reports] == [5, 5, 6, 6]


def test_a_trace_has_no_workload_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate.cli import main

    with pytest.raises(ValueError, match="no workload seed"):
        sweep(None, TRACE, {}, [1.0], 2, ["kvgate"], workload_seeds=[1])
    args = [
        "bench",
        "sweep",
        "--trace",
        str(TRACE),
        "--workload-seed",
        "1,2",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 2
    assert "--workload-seed needs --workload" in capsys.readouterr().out


def test_the_command_writes_a_report_per_workload_seed_and_seed(tmp_path: Path) -> None:
    from kvgate.cli import main

    out = tmp_path / "sweep"
    args = ["bench", "sweep", "--workload", "shared-prefix", "--pods", "2", "--levels", "1",
            "--targets", "kvgate", "--workload-seed", "1,2", "--seed", "3,4",
            "--out", str(out)]  # fmt: skip
    for key, value in SMALL.items():
        args += ["--param", f"{key}={value}"]
    assert main(args) == 0
    for draw in (1, 2):
        for seed in (3, 4):
            path = out / "load-1" / f"workload-seed-{draw}" / f"seed-{seed}" / "report.json"
            assert json.loads(path.read_text())["settings"]["workload_seed"] == draw


@pytest.mark.parametrize("seeds", ["a", "1,1", ""])
def test_seeds_must_be_distinct_integers(seeds: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "sweep", "--workload", "shared-prefix", "--seed", seeds])
    assert exit_.value.code == 2
    assert "seeds" in capsys.readouterr().err


def test_policy_params_reach_the_kvgate_target(tmp_path: Path) -> None:
    from kvgate.cli import main

    out = tmp_path / "sweep"
    args = ["bench", "sweep", "--workload", "shared-prefix", "--pods", "2", "--levels", "1",
            "--targets", "kvgate", "--policy-param", "tie_break=\"random\"",
            "--policy-param", "cost_model.prior_prefill_tokens_per_second=30000",
            "--out", str(out)]  # fmt: skip
    for key, value in SMALL.items():
        args += ["--param", f"{key}={value}"]
    assert main(args) == 0
    report = json.loads((out / "load-1" / "report.json").read_text())
    assert report["settings"]["policy_params"] == {
        "tie_break": "random",
        "cost_model": {"prior_prefill_tokens_per_second": 30000},
    }
    assert '"tie_break": "random"' in (out / "sweep.md").read_text()


def test_an_unknown_policy_param_is_an_error() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="no_such_knob"):
        sweep("shared-prefix", None, SMALL, [1], 2, ["kvgate"], policy_params={"no_such_knob": 1})


def test_bad_input_is_a_clear_error_not_a_traceback_or_a_silent_drop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target's typo was dropped silently (exit 0, a table of the others); a missing file
    and a bad --param were tracebacks; --duration in des mode was ignored; a sweep cut by
    max_duration_s replayed other rows at each level."""
    from kvgate.cli import main

    out = ["--out", str(tmp_path)]
    trace = ["--trace", str(TRACE), "--levels", "1", "--pods", "2"]
    cases = [
        (["bench", "sweep", *trace, "--targets", "kvgate,roundrobin", *out], "unknown target"),
        (["bench", "sweep", "--trace", str(tmp_path / "none.jsonl"), *out], "No such file"),
        (["bench", "sweep", *trace, "--param", "max_request=5", *out], "max_request"),
        (["bench", "sweep", *trace, "--param", "max_duration_s=5", *out], "max_requests"),
        (
            ["bench", "run", "--trace", str(tmp_path / "none.jsonl"), "--mode", "des", *out],
            "No such file",
        ),
        (
            ["bench", "run", "--trace", str(TRACE), "--mode", "des", "--duration", "5", *out],
            "--duration applies to live runs",
        ),
    ]
    for args, said in cases:
        assert main(args) == 2, args
        printed = capsys.readouterr().out
        assert said in printed and "Traceback" not in printed, (args, printed)
