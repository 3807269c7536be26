"""``kvgate bench sweep``: one workload at several load levels, every target, discrete-event.

A load level is a share of the workload's capacity: the throughput of the fleet under round
robin with every request already waiting (:func:`kvgate.bench.capacity.fleet_capacity`). For
each level the workload is rebuilt with its arrival rate set to ``level x capacity``:

- ``shared-prefix``, ``precise-prefix``, ``hot-prefix``: ``rate_rps``;
- ``mixed``: ``online_rate_rps`` and ``batch_rate_rps`` together, in the ratio the parameters
  give (defaults 6 : 1);
- a Mooncake trace: ``speedup`` = level x capacity / the trace's own request rate.

``agent-sessions`` and ``long-agent-sessions`` are closed loop (their load is their number of
sessions), so they have no level.
Every level runs :func:`kvgate.bench.des.des_report` (the router's own routing core on simulated
engines) and writes its ``report.json`` under ``OUT/load-<level>/``; ``OUT/sweep.md`` has one
table of every level and target. ``--seed 0,1,2`` runs every level once per router seed (tie
draws, replica choice), under ``OUT/load-<level>/seed-<s>/``, and the table gives each number
as the seeds' mean with their range: policies closer than that range are not told apart.
``--workload-seed 1,2,3`` does the same over draws of a named workload (its ``seed`` parameter:
which groups, prompts and arrival times), under ``OUT/load-<level>/workload-seed-<w>/``: a
difference that one draw shows and the others reverse is that draw's, not the policy's.
Live runs are left to ``kvgate bench run`` (one level per run): on a small machine the CPU, not
the policy, sets a live run's numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvgate.bench.capacity import fleet_capacity
from kvgate.bench.mooncake import TraceError
from kvgate.bench.report import BenchReport
from kvgate.bench.targets import validate_targets
from kvgate.bench.workload import Workload
from kvgate.bench.workloads import (
    WORKLOAD_NAMES,
    build_trace,
    build_workload,
    nested_params,
    parse_overrides,
)

DEFAULT_LEVELS = (0.5, 0.75, 1.0, 1.3)
_RATE_PARAM = {"shared-prefix": "rate_rps", "precise-prefix": "rate_rps", "hot-prefix": "rate_rps"}
#: The named workloads with an arrival rate to sweep.
SWEEPABLE = tuple(w for w in WORKLOAD_NAMES if w in _RATE_PARAM or w == "mixed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace")
    source.add_argument(
        "--workload",
        choices=SWEEPABLE,
        help="a named open-loop workload",
    )
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--levels",
        default=",".join(f"{x:g}" for x in DEFAULT_LEVELS),
        help="shares of round robin's capacity (default 0.5,0.75,1,1.3)",
    )
    parser.add_argument("--targets", default="round-robin,prefix,llm-d-sticky,kvgate")
    parser.add_argument(
        "--seed",
        type=_seeds,
        default=[0],
        help="router seed, or several comma-separated: each level runs once per seed and the "
        "table shows their mean and range",
    )
    parser.add_argument(
        "--workload-seed",
        type=_seeds,
        default=None,
        help="a named workload's seed, or several comma-separated: each level runs once per "
        "draw of the workload (and router seed); the table shows their mean and range",
    )
    parser.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a parameter of the kvgate target's policy, dotted keys for nested ones, e.g. "
        "tie_break=random (repeatable; the other targets run on their defaults)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out/sweep"))


class NotSweepableError(ValueError):
    """The workload or trace has no arrival rate to scale, or cannot take the options given."""


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"give one or more distinct seeds, got {text!r}")
    return seeds


def workload_at(
    name: str | None, trace: Path | None, params: dict[str, Any], level: float, pods: int
) -> tuple[Workload, float]:
    """The workload with its arrival rate at ``level`` x capacity, and that capacity (req/s)."""
    if trace is not None:
        base = build_trace(trace, params)
        if base.sessions:
            raise NotSweepableError(
                f"{trace} has rows without a timestamp: it is replayed in closed loop and has "
                "no arrival rate to sweep (use `kvgate bench run`)"
            )
        capacity = fleet_capacity(base, pods).requests_per_s
        arrivals = [r.arrival_s for r in base.requests]
        span = max(arrivals) - min(arrivals) if arrivals else 0.0
        own_rate = len(arrivals) / span if span > 0 else capacity
        speedup = float(params.get("speedup", 1.0)) * level * capacity / own_rate
        return build_trace(trace, {**params, "speedup": speedup}), capacity
    assert name is not None
    if name not in SWEEPABLE:  # before building it: a closed-loop workload can be large
        raise NotSweepableError(f"workload {name} has no arrival rate to sweep")
    base = build_workload(name, params)
    capacity = fleet_capacity(base, pods).requests_per_s
    target_rate = level * capacity
    if name == "mixed":
        online = float(base.params.get("online_rate_rps", 6.0))
        batch = float(base.params.get("batch_rate_rps", 1.0))
        scale = target_rate / (online + batch)
        rates = {"online_rate_rps": online * scale, "batch_rate_rps": batch * scale}
        return build_workload(name, {**params, **rates}), capacity
    return build_workload(name, {**params, _RATE_PARAM[name]: target_rate}), capacity


def sweep(
    name: str | None,
    trace: Path | None,
    params: dict[str, Any],
    levels: list[float],
    pods: int,
    targets: list[str],
    *,
    seeds: Sequence[int] = (0,),
    workload_seeds: Sequence[int] | None = None,
    policy_params: dict[str, Any] | None = None,
    on_level: Callable[[float, float], None] | None = None,
) -> list[tuple[float, list[BenchReport]]]:
    """Per level (in order), one discrete-event report per workload seed and router seed (in
    that order, `seeds` varying fastest); `workload_seeds` (named workloads only; None: the
    workload's own ``seed`` parameter) set the workload's ``seed``; `policy_params` apply to
    the `kvgate` target."""
    from kvgate.bench.des import des_report

    if workload_seeds is not None and name is None:
        raise NotSweepableError(
            "a trace has no workload seed (its skip_requests parameter picks a window)"
        )
    draws = [None] if workload_seeds is None else list(workload_seeds)
    out: list[tuple[float, list[BenchReport]]] = []
    for level in levels:
        reports = []
        for draw in draws:
            drawn = params if draw is None else {**params, "seed": draw}
            workload, capacity = workload_at(name, trace, drawn, level, pods)
            if on_level is not None:
                on_level(level, capacity)
            for seed in seeds:
                report, _records, _samples = des_report(
                    workload, pods, targets, seed=seed, policy_params=policy_params
                )
                report.settings["load_level"] = level
                report.settings["capacity_rps"] = capacity
                if draw is not None:
                    report.settings["workload_seed"] = draw
                reports.append(report)
        out.append((level, reports))
    return out


def sweep_table(results: list[tuple[float, list[BenchReport]]]) -> str:
    """Markdown: one row per level and target; with several seeds (router or workload), each
    number is their mean followed by their range, and errors are counted over every run."""
    lines = [
        "| load | target | TTFT mean s | TTFT p99 s | e2e mean s | req/s | hit rate "
        "| ideal | finite | decodes per prefill step | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, reports in results:
        ideal = _cell([r.ideal_hit_rate for r in reports], 3)
        finite = _cell([r.finite_hit_rate for r in reports], 3)
        for name in reports[0].targets:
            runs = [r.targets[name] for r in reports]
            lines.append(
                f"| {level:g} | {name} | {_cell([s.ttft_mean_s for s in runs], 3)} "
                f"| {_cell([s.ttft_p99_s for s in runs], 3)} "
                f"| {_cell([s.e2e_mean_s for s in runs], 3)} "
                f"| {_cell([s.throughput_rps for s in runs], 2)} "
                f"| {_cell([s.hit_rate for s in runs], 3)} "
                f"| {ideal} | {finite} "
                f"| {_cell([s.engine.get('decodes_per_prefill_step') or 0.0 for s in runs], 1)} "
                f"| {sum(s.errors for s in runs)} |"
            )
    return "\n".join(lines) + "\n"


def _cell(values: list[float], digits: int) -> str:
    mean = f"{statistics.fmean(values):.{digits}f}"
    if len(values) == 1:
        return mean
    return f"{mean} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def run_sweep(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    levels = [float(x) for x in args.levels.split(",") if x.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    params: dict[str, Any] = dict(parse_overrides(args.param))
    policy_params = nested_params(args.policy_param)
    source = args.workload or str(args.trace)

    def on_level(level: float, capacity: float) -> None:
        say(f"{source}: load {level:g} x {capacity:.2f} req/s (round robin's capacity)")

    if args.workload_seed is not None and args.trace is not None:
        say("error: --workload-seed needs --workload (a trace's requests are fixed)")
        return 2
    if "max_duration_s" in params:
        # cut after each level's speed-up, it would replay another slice of the trace at each
        say("error: a sweep cannot cut by max_duration_s (each level would replay other "
            "rows); use max_requests")  # fmt: skip
        return 2
    try:
        targets = validate_targets(targets)
        results = sweep(
            args.workload, args.trace, params, levels, args.pods, targets, seeds=args.seed,
            workload_seeds=args.workload_seed, policy_params=policy_params or None,
            on_level=on_level,
        )  # fmt: skip
    except (NotSweepableError, TraceError, ValueError, OSError) as exc:  # bad input, no file
        say(f"error: {exc}")
        return 2
    draws = args.workload_seed or [None]
    runs = [(draw, seed) for draw in draws for seed in args.seed]
    for level, reports in results:
        for (draw, seed), report in zip(runs, reports, strict=True):
            run_dir = args.out / f"load-{level:g}"
            if len(draws) > 1:
                run_dir /= f"workload-seed-{draw}"
            if len(args.seed) > 1:
                run_dir /= f"seed-{seed}"
            report.write(run_dir)
    table = sweep_table(results)
    args.out.mkdir(parents=True, exist_ok=True)
    title = f"# {source}, {args.pods} pods"
    if policy_params:
        title += f"\n\nkvgate policy params: `{json.dumps(policy_params, sort_keys=True)}`"
    (args.out / "sweep.md").write_text(f"{title}\n\n{table}")
    say(table)
    return 0
