"""`kvgate bench context`: long agent sessions three ways on the same simulated fleet.

    kvgate bench context --pods 2 --param num_sessions=8 --out out/context.json

Builds the ``long-agent-sessions`` workload once per context mode (full history, summarised at
a threshold, AKV rolling drop; :mod:`kvgate.bench.long_agent`), runs each through the router's
routing core in the discrete-event simulator on the same fleet of ``--sim-akv`` pods (pods that
apply AKV ops; the other modes send none), and prints per mode: prompt tokens sent, prefill
tokens computed, prefix-cache hit rate, TTFT, time per output token (a decode step) and the
peak KV-cache use of any pod. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvgate.bench.des import run_des
from kvgate.bench.long_agent import CONTEXT_MODES
from kvgate.bench.report import summarize
from kvgate.bench.workloads import build_workload, parse_overrides


@dataclass(frozen=True)
class ContextRow:
    context: str
    turns: int
    errors: int
    prompt_tokens: int
    prefill_tokens: int  # computed: prompt tokens the prefix cache did not serve
    hit_rate: float
    ttft_mean_s: float
    ttft_p90_s: float
    tpot_mean_ms: float
    peak_kv_usage: float
    makespan_s: float


def compare_contexts(
    overrides: Mapping[str, Any], pods: int, *, policy: str = "kvgate", seed: int = 0
) -> list[ContextRow]:
    rows = []
    for mode in CONTEXT_MODES:
        workload = build_workload("long-agent-sessions", {**overrides, "context": mode})
        result = run_des(workload, policy, pods, seed=seed, cache_ops=True)
        summary = summarize(mode, result.records)
        rows.append(
            ContextRow(
                context=mode,
                turns=summary.requests,
                errors=summary.errors,
                prompt_tokens=summary.prompt_tokens,
                prefill_tokens=summary.prompt_tokens - summary.cached_tokens,
                hit_rate=summary.hit_rate,
                ttft_mean_s=summary.ttft_mean_s,
                ttft_p90_s=summary.ttft_p90_s,
                tpot_mean_ms=summary.tpot_mean_s * 1000,
                peak_kv_usage=result.peak_kv_usage,
                makespan_s=summary.makespan_s,
            )
        )
    return rows


def table(rows: list[ContextRow]) -> str:
    lines = [
        "| context | turns | errors | prompt tokens | prefill tokens | hit rate | TTFT mean s "
        "| TTFT p90 s | TPOT ms | peak KV | makespan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.context} | {r.turns} | {r.errors} | {r.prompt_tokens:,} | "
            f"{r.prefill_tokens:,} | {r.hit_rate:.3f} | {r.ttft_mean_s:.3f} | "
            f"{r.ttft_p90_s:.3f} | {r.tpot_mean_ms:.2f} | {r.peak_kv_usage:.1%} | "
            f"{r.makespan_s:.0f} |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=2, help="simulated pods (default 2)")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="long-agent-sessions parameter (num_sessions, turns, summarise_at_tokens, ...)",
    )
    parser.add_argument("--policy", default="kvgate", help="routing policy (default kvgate)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")


def run(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    try:
        overrides = parse_overrides(args.param)
        rows = compare_contexts(overrides, args.pods, policy=args.policy, seed=args.seed)
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    say(table(rows))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
        say(f"rows: {args.out}")
    return 0
