"""Flow control in the discrete-event bench: one tenant floods, the other's TTFT; batch alone.

Prints, for kvgate's routing core (``kvgate.bench.des``) on simulated H100 pods:

1. **fairness**: tenant `short` (1k-token prompts, Poisson) alone, then with tenant `flood`
   sending long prompts at several times the fleet's prefill capacity; with flow control on
   (the default) and off (every request sent at once, as before). The target: `short`'s p99
   TTFT within 1.2x of running alone.
2. **batch throughput**: batch-class requests only (online idle), flow control on and off; the
   target: output tokens/s within 5%.

    PYTHONPATH=. .venv/bin/python -m benchmarks.flow_control [--pods 4] [--flood-tokens 4096 32768]
        [--variant max_kv_cache_usage=0.95 ...] [--duration 30] [--no-off] [--skip-batch]
        [--mixed]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, replace
from typing import Any

from kvgate.bench.des import run_des
from kvgate.bench.records import RequestRecord
from kvgate.bench.report import summarize
from kvgate.bench.workload import (
    BenchRequest,
    Workload,
    completion_request,
    poisson_arrivals,
    random_tokens,
)
from kvgate.bench.workloads import build_workload
from kvgate.sim.engine import EngineConfig

TENANTS = {
    "tenants": [
        {"name": "short", "api_keys": [{"value": "k-short"}]},
        {"name": "flood", "api_keys": [{"value": "k-flood"}]},
    ]
}
# A simulated H100 pod (Llama-3.1-8B profile) prefills about this many prompt tokens a second.
POD_PREFILL_TOKENS_PER_S = 30_000


def tenants_config(short_weight: float = 1.0) -> dict[str, Any]:
    """The router's `tenants` section: `short` (key k-short) at ``short_weight``, `flood`
    (k-flood) at weight 1."""
    short, flood = TENANTS["tenants"]
    return {"tenants": [{**short, "weight": short_weight}, flood]}


@dataclass(frozen=True)
class TwoTenants:
    """Tenant `short`'s requests alone, and with tenant `flood`'s: the fairness workload."""

    short: list[BenchRequest]
    flood: list[BenchRequest]
    flood_rate_rps: float

    @property
    def alone(self) -> Workload:
        return Workload("short-alone", tuple(self.short))

    @property
    def both(self) -> Workload:
        merged = sorted(self.short + self.flood, key=lambda r: r.arrival_s)
        return Workload("short+flood", tuple(merged))


def two_tenants(pods: int, flood_tokens: int, seed: int, duration_s: float) -> TwoTenants:
    """`short`: 1024-token prompts, 64 output tokens, Poisson 10 req/s for ``duration_s``;
    `flood`: ``flood_tokens``-token prompts, 64 output tokens, at twice the fleet's prefill
    capacity for as long."""
    short = _requests(
        "short", random.Random(seed), count=int(10 * duration_s), rate_rps=10.0,
        prompt_tokens=1024, output_tokens=64, api_key="k-short",
    )  # fmt: skip
    flood_rate = 2 * pods * POD_PREFILL_TOKENS_PER_S / flood_tokens
    flood = _requests(
        "flood", random.Random(seed + 1), count=int(duration_s * flood_rate),
        rate_rps=flood_rate, prompt_tokens=flood_tokens, output_tokens=64, api_key="k-flood",
    )  # fmt: skip
    return TwoTenants(short, flood, flood_rate)


def _requests(
    name: str,
    rng: random.Random,
    *,
    count: int,
    rate_rps: float,
    prompt_tokens: int,
    output_tokens: int,
    api_key: str | None = None,
    request_class: str = "online",
    start_s: float = 0.0,
) -> list[BenchRequest]:
    arrivals = poisson_arrivals(count, rate_rps, rng)
    return [
        replace(
            completion_request(
                f"{name}-{i}",
                random_tokens(rng, prompt_tokens, 32000),
                output_tokens,
                start_s + at,
                request_class=request_class,
            ),
            api_key=api_key,
        )
        for i, at in enumerate(arrivals)
    ]


def _run(
    workload: Workload,
    pods: int,
    flow: bool,
    pool_class: str = "online",
    flow_params: dict[str, Any] | None = None,
    tenants: bool = True,
) -> list[RequestRecord]:
    params = dict(flow_params or {})
    short_weight = params.pop("short_weight", 1.0)  # tenant `short`'s weight, not a setting
    update: dict[str, Any] = {"flow_control": {"enabled": flow, **params}}
    if tenants:
        update["tenants"] = tenants_config(short_weight)
    result = run_des(
        workload,
        "kvgate",
        pods,
        engine=EngineConfig(block_size=16),
        config_update=update,
        pool_class=pool_class,
    )
    return result.records


def _ttft(records: list[RequestRecord], prefix: str) -> tuple[float, float, int, int]:
    s = summarize(prefix, [r for r in records if r.request_id.startswith(prefix)])
    return s.ttft_p50_s, s.ttft_p99_s, s.completed, s.errors


def fairness(
    pods: int, flood_tokens: int, seed: int, duration_s: float, variants: list[str], off: bool
) -> None:
    workload = two_tenants(pods, flood_tokens, seed, duration_s)
    flood, flood_rate, both = workload.flood, workload.flood_rate_rps, workload.both
    base = _ttft(_run(workload.alone, pods, True), "short-")
    print(f"\nflood of {len(flood)} x {flood_tokens}-token prompts at {flood_rate:.1f} req/s")
    print(
        "| run | short p50 TTFT s | short p99 TTFT s | p99 / alone | short ok | flood ok | refused |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| short alone | {base[0]:.3f} | {base[1]:.3f} | 1.00 | {base[2]} | - | {base[3]} |")
    runs = [(True, v) for v in variants] + ([(False, "")] if off else [])
    for flow, variant in runs:
        records = _run(both, pods, flow, flow_params=_params(variant))
        s = _ttft(records, "short-")
        f = _ttft(records, "flood-")
        label = f"flow control {variant or 'defaults'}" if flow else "flow control off"
        print(
            f"| with flood, {label} | {s[0]:.3f} | {s[1]:.3f} | {s[1] / base[1]:.2f} | {s[2]} "
            f"| {f[2]} | {s[3] + f[3]} |"
        )


def _params(variant: str) -> dict[str, Any]:
    """`key=value,key=value` -> flow_control settings (numbers)."""
    pairs = [item.split("=", 1) for item in variant.split(",") if item]
    return {key: float(value) if "." in value else int(value) for key, value in pairs}


def batch_throughput(pods: int, seed: int, variants: list[str]) -> None:
    batch = _requests(
        "batch", random.Random(seed + 2), count=1500, rate_rps=50.0, prompt_tokens=2048,
        output_tokens=256, request_class="batch",
    )  # fmt: skip
    workload = Workload("batch-only", tuple(batch))
    print(
        "\nbatch only (online idle), a batch pool: 1500 x 2048-token prompts, 256 output "
        "tokens, 50 req/s"
    )
    print("| run | output tok/s | req/s | completed | TTFT p50 s | e2e mean s |")
    print("|---|---|---|---|---|---|")
    for flow, variant in [(True, v) for v in variants] + [(False, "")]:
        records = _run(workload, pods, flow, pool_class="batch", flow_params=_params(variant))
        s = summarize("kvgate", records)
        label = f"flow control {variant or 'defaults'}" if flow else "flow control off"
        print(
            f"| {label} | {s.output_tps:.0f} | {s.throughput_rps:.2f} | {s.completed} "
            f"| {s.ttft_p50_s:.3f} | {s.e2e_mean_s:.2f} |"
        )


def mixed(pods: int) -> None:
    """The `mixed` workload at 75% load (online chat + batch documents) on the quick-start's one
    online pool, no tenants: per class, with flow control and without."""
    workload = build_workload("mixed", {"online_rate_rps": 43, "batch_rate_rps": 6.8})
    print("\nmixed at 75% (online 43 req/s + batch 6.8 req/s), one online pool")
    print("| run | class | served | TTFT mean s | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|")
    for flow in (True, False):
        records = _run(workload, pods, flow, tenants=False)
        for request_class in ("online", "batch"):
            s = summarize(request_class, [r for r in records if r.request_class == request_class])
            label = "flow control" if flow else "no flow control"
            print(
                f"| {label} | {request_class} | {s.completed}/{s.requests} "
                f"| {s.ttft_mean_s:.3f} | {s.ttft_p50_s:.3f} | {s.ttft_p99_s:.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--flood-tokens", type=int, nargs="*", default=[4096, 32768])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of traffic")
    parser.add_argument(
        "--variant", nargs="+", default=[""],
        help="flow_control settings to compare, each `key=value,...` ('' = the defaults; "
        "short_weight=W sets tenant short's weight)",
    )  # fmt: skip
    parser.add_argument(
        "--no-off", action="store_true", help="skip the (slow) runs without flow control"
    )
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--mixed", action="store_true", help="also the mixed workload, per class")
    args = parser.parse_args()
    for tokens in args.flood_tokens:
        fairness(args.pods, tokens, args.seed, args.duration, args.variant, not args.no_off)
    if not args.skip_batch:
        batch_throughput(args.pods, args.seed, args.variant)
    if args.mixed:
        mixed(args.pods)


if __name__ == "__main__":
    main()
