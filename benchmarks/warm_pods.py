"""Scale-up from 4 to 6 pods in the middle of a run, with and without warm-up (issue 14).

    .venv/bin/python -m benchmarks.warm_pods [--rate 40] [--seconds 120] [--scale-at 40]
        [--groups 32] [--system-tokens 6000] [--output-tokens 200]

The discrete-event bench (`kvgate.bench.des`: the router's own `RoutingCore`, `kvgate` policy,
over simulated engines in virtual time) replays one shared-prefix workload (`--groups` system
prompts of `--system-tokens` tokens, 200-token questions, Poisson arrivals at `--rate`, more
than 4 pods can serve) three times: warm-up off; on with its defaults but every group's prefix
warmed (`top_prefixes` 64); on with no ramp. At `--scale-at` seconds 2 pods join. Printed: mean
and p99 TTFT and the prefix hit rate before the scale-up, in its first minute, and after; the
worst 5-second mean TTFT of the first minute; and the first minute's requests on the new pods.
"""

from __future__ import annotations

import argparse
import statistics

from kvgate.api.fleet import WarmupConfig
from kvgate.bench.des import run_des
from kvgate.bench.records import RequestRecord
from kvgate.bench.report import summarize
from kvgate.bench.shared_prefix import SharedPrefixParams, build_shared_prefix

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--scale-at", type=float, default=40.0)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=6000)
    parser.add_argument("--output-tokens", type=int, default=200)
    args = parser.parse_args()
    workload = build_shared_prefix(
        SharedPrefixParams(
            num_groups=args.groups,
            prompts_per_group=max(1, int(args.rate * args.seconds / args.groups)),
            system_prompt_len=args.system_tokens,
            question_len=200,
            output_len=args.output_tokens,
            rate_rps=args.rate,
        )
    )
    at, minute = args.scale_at, args.scale_at + 60.0
    print(f"{workload.size} requests, 4 -> 6 pods at {at:.0f} s (TTFT ms: mean p99, hit rate, n)")  # noqa: T201
    header = f"{'':18} {'before':26} | {'first minute':26} | {'after':26} | worst 5 s | new pods"
    print(header)  # noqa: T201 - the benchmark's report
    for name, warmup in VARIANTS.items():
        records = run_des(workload, "kvgate", 4, scale=[(at, 2)], warmup=warmup).records
        before = [r for r in records if r.sent_s < at]
        first = [r for r in records if at <= r.sent_s < minute]
        after = [r for r in records if r.sent_s >= minute]
        windows = [
            _ttfts([r for r in first if at + i <= r.sent_s < at + i + 5]) for i in range(0, 60, 5)
        ]
        worst = max(statistics.mean(w) for w in windows if w) * 1000
        new = [r for r in first if r.endpoint in ("pod-4", "pod-5")]
        line = f"{name:18} {_stats(before)} | {_stats(first)} | {_stats(after)} | {worst:9.1f}"
        print(f"{line} | {_stats(new)}", flush=True)  # noqa: T201


if __name__ == "__main__":
    main()
