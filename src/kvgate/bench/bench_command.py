"""`kvgate bench run`: one workload through several routers on a simulated fleet, side by side.

    kvgate bench run --workload shared-prefix --pods 4 --targets round-robin,kvgate --out out/
    kvgate bench run --trace trace.jsonl --speedup 4 --targets kvgate,sglang-cache-aware --out out/
    kvgate bench run --workload hot-prefix --mode des --pods 64 --param num_requests=100000 ...
    kvgate bench context --pods 2 --param num_sessions=8   # full vs summarised vs AKV drop

``--mode live`` (default) starts ``kvgate sim fleet`` and each target as real processes on
loopback and sends real HTTP; ``--mode des`` runs the simulator's discrete-event mode with the
scoring policies plugged in directly (no HTTP, simulated time: 64 pods and 100k requests in
minutes). Both write report.json, report.md and PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from kvgate.bench.agent_sessions import ChatTokenizer, Message, render_chat_text
from kvgate.bench.context_compare import add_arguments as add_context_arguments
from kvgate.bench.context_compare import run as run_context
from kvgate.bench.harness import BenchResult, HarnessSettings, run_live, write_outputs
from kvgate.bench.mooncake import body_tokenizer
from kvgate.bench.plots import write_plots
from kvgate.bench.processes import StartError
from kvgate.bench.records import RequestRecord
from kvgate.bench.sweep import add_arguments as add_sweep_arguments
from kvgate.bench.sweep import run_sweep
from kvgate.bench.targets import kvgate_policies, target_names, validate_targets
from kvgate.bench.workload import CHAT_COMPLETIONS, COMPLETIONS, Workload
from kvgate.bench.workloads import (
    WORKLOAD_NAMES,
    build_trace,
    build_workload,
    nested_params,
    parse_overrides,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    run_parser = sub.add_parser("run", help="run a benchmark and write report.json + plots")
    add_run_arguments(run_parser)
    capacity = sub.add_parser(
        "capacity", help="round-robin capacity of N simulated pods for a workload (req/s)"
    )
    source = capacity.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace")
    source.add_argument("--workload", choices=WORKLOAD_NAMES, help="a named workload")
    capacity.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    capacity.add_argument("--pods", type=int, default=4)
    capacity.add_argument("--sample", type=int, default=1500, help="requests simulated")
    capacity.add_argument("--tokenizer", default=None)
    capacity.set_defaults(speedup=None, jitter=None)
    context = sub.add_parser(
        "context", help="long agent sessions: full history vs summarised vs AKV rolling drop"
    )
    add_context_arguments(context)
    sweep = sub.add_parser(
        "sweep", help="one workload at several loads, every target, discrete-event (sweep.md)"
    )
    add_sweep_arguments(sweep)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace to replay")
    source.add_argument("--workload", choices=WORKLOAD_NAMES, help="a named workload")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a workload parameter (repeatable), e.g. num_groups=8 rate_rps=4",
    )
    parser.add_argument("--pods", type=int, default=4, help="simulated pods (default 4)")
    parser.add_argument(
        "--targets",
        default="round-robin,kvgate",
        help=f"comma-separated, from: {', '.join(target_names())} (default round-robin,kvgate)",
    )
    parser.add_argument("--speedup", type=float, default=None, help="trace time speed-up factor")
    parser.add_argument("--jitter", type=float, default=None, help="trace arrival jitter, seconds")
    parser.add_argument(
        "--duration", type=float, default=None, help="send no new request after S seconds"
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--mode",
        choices=("live", "des"),
        default="live",
        help="live: real processes and HTTP; des: discrete-event simulation (kvgate policies only)",
    )
    parser.add_argument("--seed", type=int, default=0, help="des mode: routing RNG seed")
    parser.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="des mode: a parameter of the kvgate policy, dotted keys for nested ones, e.g. "
        "cost_model.prior_prefill_tokens_per_second=30000 (repeatable)",
    )
    parser.add_argument("--model", default="sim-model", help="model name the fleet serves")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="live mode: wall seconds per simulated GPU second (sim --sim-time-scale)",
    )
    parser.add_argument(
        "--clients",
        type=_positive_int,
        default=1,
        help="live mode: load-generator processes sharing the schedule (default 1); more when "
        "the report says the generator lagged",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for the pods and kvgate's routers (exact prefix keys); "
        "default: the simulator's 4-characters-a-token codec, routers key approximately",
    )
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="pods publish KV events and kvgate's routers index them (use with --tokenizer)",
    )
    parser.add_argument(
        "--fresh-fleet",
        action="store_true",
        help="restart the fleet for every target (default: reset its prefix caches)",
    )
    parser.add_argument(
        "--fleet-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `kvgate sim fleet` (repeatable; use --fleet-arg=--flag)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `kvgate router` (repeatable; use --router-arg=--flag)",
    )


def load_workload(args: argparse.Namespace) -> Workload:
    overrides: dict[str, object] = dict(parse_overrides(args.param))
    if args.trace is not None:
        if args.speedup is not None:
            overrides["speedup"] = args.speedup
        if args.jitter is not None:
            overrides["jitter_s"] = args.jitter
        return build_trace(args.trace, overrides, tokenizer=args.tokenizer)
    if args.speedup is not None or args.jitter is not None:
        raise ValueError("--speedup and --jitter apply to --trace only")
    api = str(overrides.get("api", "chat"))
    return build_workload(args.workload, overrides, tokenize=chat_tokenizer(args.tokenizer, api))


def chat_tokenizer(tokenizer: str | None = None, api: str = "chat") -> ChatTokenizer:
    """How the fleet's pods tokenize an agent turn (for the ideal hit-rate bound): the
    simulator's own codec, or the ``--tokenizer`` folder's; for ``api=completions`` the turn is
    the rendered history sent as a completion prompt."""
    tokenize_body = body_tokenizer(tokenizer)

    def tokenize(messages: Sequence[Message]) -> list[int]:
        if api == "completions":
            return tokenize_body(COMPLETIONS, {"prompt": render_chat_text(messages)})
        return tokenize_body(CHAT_COMPLETIONS, {"messages": list(messages)})

    return tokenize


def run(args: argparse.Namespace) -> int:
    quiet_http_logs()
    console = Console()
    if args.action == "sweep":
        return run_sweep(args, lambda text: console.print(text, markup=False))
    if args.action == "capacity":
        return run_capacity(args, console)
    if args.action == "context":
        return run_context(args, lambda text: console.print(text, markup=False, soft_wrap=True))
    try:
        targets = validate_targets([t.strip() for t in args.targets.split(",") if t.strip()])
        if args.mode == "des" and args.duration is not None:
            raise ValueError(
                "--duration applies to live runs; a discrete-event run is cut with --param "
                "max_requests=N (or max_duration_s=S for a trace)"
            )
        workload = load_workload(args)
    except (ValueError, OSError) as exc:  # bad input, or no such file
        console.print(Text.assemble(("error:", "red"), f" {exc}"))
        return 2
    if args.mode == "des":
        return run_des_mode(workload, targets, args, console)
    settings = HarnessSettings(
        pods=args.pods,
        model=args.model,
        targets=targets,
        duration_s=args.duration,
        fresh_fleet=args.fresh_fleet,
        time_scale=args.time_scale,
        clients=args.clients,
        tokenizer=args.tokenizer,
        kv_events=args.kv_events,
        fleet_args=list(args.fleet_arg),
        router_args=list(args.router_arg),
    )
    console.print(
        f"[bold]{workload.name}[/bold]: {workload.description} — {workload.size} requests, "
        f"{settings.pods} pods, targets {', '.join(targets)}"
    )
    try:
        result = run_live_with_progress(workload, settings, args.out, console)
    except StartError as exc:
        console.print(
            Text.assemble(("error:", "red"), f" the simulated fleet did not start: {exc}")
        )
        return 1
    console.print(result_table_text(result.report_path), markup=False)
    console.print(f"report: {result.report_path}")
    for plot in result.plots:
        console.print(f"plot:   {plot}")
    return exit_code(result.report.targets.keys(), targets)


def run_capacity(args: argparse.Namespace, console: Console) -> int:
    """``kvgate bench capacity``: the rate that 100% load means for ``--load`` style runs."""
    from kvgate.bench.capacity import fleet_capacity

    try:
        workload = load_workload(args)
    except ValueError as exc:
        console.print(f"error: {exc}", markup=False)
        return 2
    cap = fleet_capacity(workload, args.pods, sample=args.sample)
    console.print(
        f"{workload.name} on {args.pods} pods: {cap.requests_per_s:.2f} req/s, "
        f"{cap.output_tokens_per_s:.0f} output tok/s under round robin "
        f"({cap.sampled_requests} requests simulated); 75% = {0.75 * cap.requests_per_s:.2f} req/s",
        markup=False,
    )
    return 0


def run_des_mode(
    workload: Workload, targets: list[str], args: argparse.Namespace, console: Console
) -> int:
    """``--mode des``: every kvgate policy on simulated engines, in simulated time."""
    from kvgate.bench.des import des_report

    console.print(
        f"[bold]{workload.name}[/bold] (discrete-event): {workload.description} — "
        f"{workload.size} requests, {args.pods} pods, targets {', '.join(targets)}"
    )
    progress = Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} requests"),
        TimeElapsedColumn(),
        console=console,
    )

    def on_target(name: str) -> Callable[[int], None]:
        task = progress.add_task(name, total=workload.size)
        return lambda done: progress.update(task, completed=done) if done % 200 == 0 else None

    with progress:
        report, records, samples = des_report(
            workload,
            args.pods,
            targets,
            seed=args.seed,
            on_target=on_target,
            policy_params=nested_params(args.policy_param),
        )
    report_path = report.write(args.out)
    plots = write_plots(report, records, samples, args.out)
    console.print(result_table_text(report_path), markup=False)
    console.print(f"report: {report_path}")
    for plot in plots:
        console.print(f"plot:   {plot}")
    return exit_code(report.targets.keys(), [t for t in targets if t in kvgate_policies()])


def quiet_http_logs() -> None:
    """httpx logs every request at INFO: thousands of lines that would hide the progress bar."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def exit_code(ran: Iterable[str], wanted: list[str]) -> int:
    """0 when every target ran, 1 when some could not start (the report says why)."""
    return 0 if set(wanted) <= set(ran) else 1


def result_table_text(report_path: Path) -> str:
    return (report_path.parent / "report.md").read_text()


def run_live_with_progress(
    workload: Workload, settings: HarnessSettings, out_dir: Path, console: Console
) -> BenchResult:
    """Run the live harness under a rich progress bar, one bar per target.

    The bar counts completed requests, or, when ``settings.duration_s`` cuts the workload, the
    seconds of the sending window (in-flight requests then drain with the bar full).
    """
    progress = Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        TextColumn("{task.fields[done]} done, {task.fields[errors]} errors"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    timed = settings.duration_s is not None
    total = settings.duration_s if timed else workload.size
    state: dict[str, Any] = {}

    def finish_previous() -> None:
        if "task" in state:
            progress.update(state["task"], completed=total)
            progress.stop_task(state["task"])

    def on_target(name: str, _index: int, _count: int) -> None:
        finish_previous()
        state["task"] = progress.add_task(name, total=total, done=0, errors=0)
        state["t0"] = time.monotonic()

    def on_record(record: RequestRecord) -> None:
        task: TaskID = state["task"]
        fields = progress.tasks[task].fields
        update: dict[str, Any] = {"done": fields["done"] + 1}
        if not record.ok:
            update["errors"] = fields["errors"] + 1
        if timed:
            elapsed = (time.monotonic() - state["t0"]) / settings.time_scale
            update["completed"] = min(elapsed, total or 0.0)
        else:
            update["advance"] = 1
        progress.update(task, **update)

    out_dir.mkdir(parents=True, exist_ok=True)
    with progress:
        run = asyncio.run(
            run_live(workload, settings, out_dir / "logs", on_target=on_target, progress=on_record)
        )
        finish_previous()
    return write_outputs(workload, settings, run, out_dir)
