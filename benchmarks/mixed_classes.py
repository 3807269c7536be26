"""Online and batch traffic on one online pool: each class's TTFT, by borrowing limit and with
or without kvgate's class isolation (issue 11, the mixed workload).

    .venv/bin/python -m benchmarks.mixed_classes [--levels 0.75,1,1.3] [--pods 4]
        [--running 8,16,32] [--targets kvgate,dynamo-kv]

The discrete-event bench (`kvgate.bench.des`: the router's own `RoutingCore` and flow control
over simulated engines in virtual time) replays the `mixed` workload (online chat on 16 shared
1,024-token prefixes + batch documents of 4,608 tokens) at each share of round robin's capacity
(`kvgate bench sweep`'s levels), for every `borrowing.max_running_requests` given, with each
target; `kvgate` also runs with `class_isolation: null`. Printed per run and class: requests,
mean and p99 TTFT, mean end-to-end time (seconds), and how many pods served both classes'
requests (a pod counts when it served at least 5% of each class).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvgate.bench.des import run_des
from kvgate.bench.records import RequestRecord
from kvgate.bench.report import summarize
from kvgate.bench.sweep import workload_at


def _variants(targets: list[str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    out: list[tuple[str, str, dict[str, Any] | None]] = []
    for target in targets:
        out.append((target, target, None))
        if target == "kvgate":
            out.append(("kvgate, no class isolation", target, {"class_isolation": None}))
    return out


def _shared_pods(records: list[RequestRecord]) -> int:
    by_class: dict[str, dict[str, int]] = {}
    for r in records:
        if r.endpoint is not None:
            pods = by_class.setdefault(r.request_class, {})
            pods[r.endpoint] = pods.get(r.endpoint, 0) + 1
    online, batch = by_class.get("online", {}), by_class.get("batch", {})
    n_online, n_batch = sum(online.values()), sum(batch.values())
    return sum(
        1
        for pod in online.keys() & batch.keys()
        if online[pod] >= 0.05 * n_online and batch[pod] >= 0.05 * n_batch
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0.75,1,1.3")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--running", default="8,16,32")
    parser.add_argument("--targets", default="kvgate,dynamo-kv")
    args = parser.parse_args()
    print(  # noqa: T201 - the benchmark's report
        "| load | running limit | target | class | requests | TTFT mean | p99 | e2e | shared pods |"
    )
    print("|---|---|---|---|---|---|---|---|---|")  # noqa: T201
    for level in (float(x) for x in args.levels.split(",")):
        workload, _capacity = workload_at("mixed", None, {}, level, args.pods)
        for running in (int(x) for x in args.running.split(",")):
            config = {"borrowing": {"max_running_requests": running}}
            for label, policy, params in _variants(args.targets.split(",")):
                result = run_des(
                    workload, policy, args.pods, policy_params=params, config_update=config
                )
                shared = _shared_pods(result.records)
                for cls in ("online", "batch"):
                    s = summarize(label, [r for r in result.records if r.request_class == cls])
                    print(  # noqa: T201
                        f"| {level:g} | {running} | {label} | {cls} | {s.completed} | "
                        f"{s.ttft_mean_s:.3f} | {s.ttft_p99_s:.3f} | {s.e2e_mean_s:.2f} | {shared} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
