"""Router replicas vs one router at the same offered load, with and without sharing load (issue 14).

    .venv/bin/python -m benchmarks.router_replicas [--pods 8] [--requests 2048] [--burst 64]
        [--burst-seconds 0.5] [--every 2.0] [--groups 32] [--system-tokens 2000]
        [--replicas 3] [--workload NAME | --trace FILE [--param KEY=VALUE]] [--level 1]

The discrete-event bench (`kvgate.bench.des`: the router's own `RoutingCore`, `kvgate` policy,
over simulated engines in virtual time) replays one bursty shared-prefix workload (`--groups`
system prompts, 200-token questions, 100 tokens out; `--burst` requests spread over
`--burst-seconds` every `--every` seconds) through one router, `--replicas` replicas that each
count only their own requests, and as many that share them (`load_sharing`, every
`--interval` seconds; 20 ms is the default): their loads, and the blocks of their requests in
flight, which they record in the directory. Replicas share the one directory (Redis in
production) and every request goes to one of them at random, as a Service spreads connections.
`--workload` (a `kvgate bench sweep` workload) or `--trace` (a Mooncake trace) replaces the
bursty workload with that one at `--level` x round robin's capacity, as the sweep builds it.
Printed: mean and p99 TTFT, mean end-to-end time, prefix hit rate, and each run's mean TTFT and
hit rate over one router's.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from pathlib import Path

from kvgate.api.fleet import LoadSharingConfig
from kvgate.bench.des import run_des
from kvgate.bench.report import summarize
from kvgate.bench.shared_prefix import SharedPrefixParams, build_shared_prefix
from kvgate.bench.sweep import SWEEPABLE, workload_at
from kvgate.bench.workload import Workload
from kvgate.bench.workloads import parse_overrides


def _bursty(args: argparse.Namespace) -> Workload:
    workload = build_shared_prefix(
        SharedPrefixParams(
            num_groups=args.groups,
            prompts_per_group=max(1, args.requests // args.groups),
            system_prompt_len=args.system_tokens,
            question_len=200,
            output_len=100,
        )
    )
    rng = random.Random(1)
    requests = sorted(
        (
            dataclasses.replace(
                r, arrival_s=(i // args.burst) * args.every + rng.random() * args.burst_seconds
            )
            for i, r in enumerate(workload.requests)
        ),
        key=lambda r: r.arrival_s,
    )
    return dataclasses.replace(workload, requests=tuple(requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument("--burst-seconds", type=float, default=0.5)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=LoadSharingConfig().interval_seconds)
    parser.add_argument("--replicas", type=int, default=3)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", choices=SWEEPABLE)
    source.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--level", type=float, default=1.0)
    args = parser.parse_args()
    if args.workload or args.trace:
        params = dict(parse_overrides(args.param))
        workload, _ = workload_at(args.workload, args.trace, params, args.level, args.pods)
    else:
        workload = _bursty(args)
    sharing = LoadSharingConfig(interval_seconds=args.interval)
    n = args.replicas
    runs = {
        "1 router": (1, None),
        f"{n} replicas, own counts": (n, None),
        f"{n} replicas, sharing every {args.interval * 1000:.0f} ms": (n, sharing),
    }
    print(f"{workload.size} requests on {args.pods} pods (TTFT ms)")  # noqa: T201
    base: tuple[float, float, float] | None = None
    for name, (replicas, load_sharing) in runs.items():
        records = run_des(
            workload, "kvgate", args.pods, replicas=replicas, load_sharing=load_sharing
        ).records
        summary = summarize(name, records)
        mean, p99, hit = summary.ttft_mean_s, summary.ttft_p99_s, summary.hit_rate
        base = base or (mean, p99, hit)
        print(  # noqa: T201
            f"{name:34} mean {mean * 1000:7.2f} p99 {p99 * 1000:7.1f} "
            f"e2e {summary.e2e_mean_s:7.3f} s hit {hit:.4f} | "
            f"mean x{mean / base[0]:.3f} hit x{hit / base[2]:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
