"""Scale-up from 4 to 6 pods in the middle of a run, with and without warm-up (issue 14).

    .venv/bin/python -m benchmarks.warm_pods [--rate 40] [--seconds 120] [--scale-at 40]
        [--groups 32] [--system-tokens 6000] [--output-tokens 200]
        [--replicas 3 [--top-prefixes 64] [--zipf 0]]

The discrete-event bench (`kvgate.bench.des`: the router's own `RoutingCore`, `kvgate` policy,
over simulated engines in virtual time) replays one shared-prefix workload (`--groups` system
prompts of `--system-tokens` tokens, 200-token questions, Poisson arrivals at `--rate`, more
than 4 pods can serve) three times: warm-up off; on with its defaults but every group's prefix
warmed (`top_prefixes` 64); on with no ramp. At `--scale-at` seconds 2 pods join. Printed: mean
and p99 TTFT and the prefix hit rate before the scale-up, in its first minute, and after; the
worst 5-second mean TTFT of the first minute; and the first minute's requests on the new pods.

With `--replicas N` it compares instead, warm-up on (`--top-prefixes`, default 64): one router;
N router replicas (each request to one at random, as a Service spreads them; loads shared, as
by default on the Redis directory) each warming the new pods from its own history; and N
replicas sharing warm-ups (one claim per pod, ranked by every replica's counts). Each line adds
the warm requests the new pods received. `--zipf S` makes group g's share of requests
proportional to 1/(g+1)^S (0: all groups alike), so that which prefixes rank first matters.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
from kvgate.bench.des import run_des
from kvgate.bench.records import RequestRecord
from kvgate.bench.report import summarize
from kvgate.bench.shared_prefix import SharedPrefixParams, build_shared_prefix
from kvgate.bench.workload import Workload

VARIANTS = {
    "no warm-up": WarmupConfig(enabled=False),
    "warm-up": WarmupConfig(top_prefixes=64),
    "warm-up, no ramp": WarmupConfig(top_prefixes=64, ramp_seconds=0),
}


def _ttfts(records: list[RequestRecord]) -> list[float]:
    return sorted(r.first_byte_s - r.sent_s for r in records if r.first_byte_s is not None)


def _stats(records: list[RequestRecord]) -> str:
    s = summarize("", records)
    if not s.completed:
        return "-"
    return (
        f"{s.ttft_mean_s * 1000:7.1f} {s.ttft_p99_s * 1000:7.1f} {s.hit_rate:5.3f} {s.completed:5d}"
    )


def _zipf(workload: Workload, skew: float, rate: float, seed: int = 3) -> Workload:
    """Keep group g's requests with probability 1/(g+1)^skew; Poisson arrivals at `rate` again."""
    rng = random.Random(seed)
    kept = [
        r
        for r in workload.requests
        if rng.random() < (int(r.request_id[1:].split("-")[0]) + 1) ** -skew
    ]
    at, requests = 0.0, []
    for request in kept:
        at += rng.expovariate(rate)
        requests.append(dataclasses.replace(request, arrival_s=at))
    return dataclasses.replace(workload, requests=tuple(requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--scale-at", type=float, default=40.0)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=6000)
    parser.add_argument("--output-tokens", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=0)
    parser.add_argument("--top-prefixes", type=int, default=64)
    parser.add_argument("--zipf", type=float, default=0.0)
    args = parser.parse_args()
    # Under a skew, enough requests are drawn that `--rate` still lasts `--seconds`.
    share = sum((g + 1) ** -args.zipf for g in range(args.groups)) / args.groups
    workload = build_shared_prefix(
        SharedPrefixParams(
            num_groups=args.groups,
            prompts_per_group=max(1, int(args.rate * args.seconds / args.groups / share)),
            system_prompt_len=args.system_tokens,
            question_len=200,
            output_len=args.output_tokens,
            rate_rps=args.rate,
        )
    )
    if args.zipf > 0:
        workload = _zipf(workload, args.zipf, args.rate)
    at, minute = args.scale_at, args.scale_at + 60.0
    print(f"{workload.size} requests, 4 -> 6 pods at {at:.0f} s (TTFT ms: mean p99, hit rate, n)")  # noqa: T201
    header = f"{'':30} {'before':26} | {'first minute':26} | {'after':26} | worst 5 s | new pods"
    print(header + (" | warm requests" if args.replicas else ""))  # noqa: T201 - the report
    runs: dict[str, tuple[WarmupConfig, int]] = {name: (w, 1) for name, w in VARIANTS.items()}
    if args.replicas:
        top = args.top_prefixes
        n = args.replicas
        runs = {
            "1 router": (WarmupConfig(top_prefixes=top), 1),
            f"{n} replicas, each on its own": (WarmupConfig(top_prefixes=top, shared=False), n),
            f"{n} replicas, shared warm-up": (WarmupConfig(top_prefixes=top, shared=True), n),
        }
    for name, (warmup, replicas) in runs.items():
        sharing = LoadSharingConfig() if replicas > 1 else None
        result = run_des(
            workload,
            "kvgate",
            4,
            scale=[(at, 2)],
            warmup=warmup,
            replicas=replicas,
            load_sharing=sharing,
        )
        records = result.records
        before = [r for r in records if r.sent_s < at]
        first = [r for r in records if at <= r.sent_s < minute]
        after = [r for r in records if r.sent_s >= minute]
        windows = [
            _ttfts([r for r in first if at + i <= r.sent_s < at + i + 5]) for i in range(0, 60, 5)
        ]
        worst = max(statistics.mean(w) for w in windows if w) * 1000
        new = [r for r in first if r.endpoint in ("pod-4", "pod-5")]
        line = f"{name:30} {_stats(before)} | {_stats(first)} | {_stats(after)} | {worst:9.1f}"
        line += f" | {_stats(new)}"
        if args.replicas:
            line += f" | {result.warm_requests}"
        print(line, flush=True)  # noqa: T201


if __name__ == "__main__":
    main()
