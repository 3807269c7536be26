"""Three router replicas vs one at the same offered load, with and without sharing load (issue 14).

    .venv/bin/python -m benchmarks.router_replicas [--pods 8] [--requests 2048] [--burst 64]
        [--burst-seconds 0.5] [--every 2.0] [--groups 32] [--system-tokens 2000]

The discrete-event bench (`kvgate.bench.des`: the router's own `RoutingCore`, `kvgate` policy,
over simulated engines in virtual time) replays one bursty shared-prefix workload (`--groups`
system prompts, 200-token questions, 100 tokens out; `--burst` requests spread over
`--burst-seconds` every `--every` seconds) through one router, three replicas that each count
only their own requests, and three that exchange their loads (`load_sharing`, every
`--interval` seconds; 20 ms is the default). Replicas share the one directory (Redis in
production) and every request goes to one of them at random, as a Service spreads connections.
Printed: mean and p99 TTFT, prefix hit rate, and each run's mean TTFT and hit rate over one
router's.
"""

from __future__ import annotations

import argparse
import dataclasses
import random

from kvgate.api.fleet import LoadSharingConfig
from kvgate.bench.des import run_des
from kvgate.bench.report import summarize
from kvgate.bench.shared_prefix import SharedPrefixParams, build_shared_prefix
from kvgate.bench.workload import Workload


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
    args = parser.parse_args()
    workload = _bursty(args)
    sharing = LoadSharingConfig(interval_seconds=args.interval)
    runs = {
        "1 router": (1, None),
        "3 replicas, own counts": (3, None),
        f"3 replicas, sharing every {args.interval * 1000:.0f} ms": (3, sharing),
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
            f"{name:34} mean {mean * 1000:7.2f} p99 {p99 * 1000:7.1f} hit {hit:.4f} | "
            f"mean x{mean / base[0]:.3f} hit x{hit / base[2]:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
