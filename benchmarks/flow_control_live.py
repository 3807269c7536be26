"""Flow control live: one tenant floods, the other's TTFT, over HTTP through a real router.

The live counterpart of ``benchmarks/flow_control.py``'s fairness table (same workload builders,
same columns). It starts ``--pods`` simulated pods (``kvgate sim serve``, one process each, as
``kvgate bench run`` does: ``kvgate.bench.fleet.SimFleet``), then for each run a fresh ``kvgate
router --config FILE`` (the quick-start config the discrete-event bench builds, plus tenants
``short`` and ``flood`` by API key and ``flow_control``), and replays the workload with the
bench's load generator (``Authorization: Bearer k-short | k-flood``):

1. tenant ``short`` alone: 1024-token prompts, 64 output tokens, Poisson 10 req/s;
2. ``short`` + ``flood``: ``--flood-tokens``-token prompts at twice the fleet's prefill capacity,
   for as long, flow control on (the default settings);
3. with ``--off``, the same without flow control.

Between runs every pod's prefix cache is emptied. Printed per run: ``short``'s p50/p99 TTFT (from
the send, queue time in the router included), p99 relative to alone, ``short`` served, ``flood``
served / answered 429, and the load generator's own health: a run in which more than 5% of the
sends left over 50 ms late, or the generator's loop stalled over 0.25 s while a ``short`` request
was in flight (a stall can delay a first byte's time stamp), says the client limited it (raise
``--time-scale`` or lower the size). ``--out`` receives ``report.json``, each run's records and
router config, and the processes' logs; every process is stopped at the end, on an error, on
Ctrl-C and on SIGTERM.

Time scale: the pods run ``--time-scale`` S times slower than real time and the arrivals are
stretched S-fold, so the 2-core machine's own overhead (router, client, HTTP) shrinks S-fold
against simulated GPU time; times are reported in simulated seconds (wall / S), send lag in wall
seconds. The router's clocks that shape the result are stretched with them (flow control's
queue deadlines and fair-share window, the affinity wait cap, the first-byte and read
timeouts), so that in simulated time the router keeps a request as long as the discrete-event
bench does; its scrape interval and the policy's cost constants stay as in any live run.

    PYTHONPATH=. .venv/bin/python -m benchmarks.flow_control_live [--pods 4]
        [--flood-tokens 4096] [--duration 30] [--time-scale 4] [--short-weight 1] [--off]
        [--out out/flow-control-live]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from benchmarks.flow_control import tenants_config, two_tenants

from kvgate.api.router_config import LimitsConfig
from kvgate.api.sections import FlowControlConfig, PolicyConfig
from kvgate.bench.fleet import SimFleet
from kvgate.bench.harness import write_records
from kvgate.bench.loadgen import LoadGenerator
from kvgate.bench.records import GeneratorHealth, RequestRecord
from kvgate.bench.report import TargetSummary, rescaled, summarize
from kvgate.bench.targets import start_config_router
from kvgate.bench.workload import Workload
from kvgate.router.setup import quickstart_config

log = logging.getLogger(__name__)

MODEL = "sim-model"
# Flow-control settings in seconds, stretched by the time scale (see the module docstring).
SCALED_FLOW_CONTROL = (
    "fair_share_window_seconds",
    "online_max_wait_seconds",
    "batch_max_wait_seconds",
    "max_deadline_seconds",
)
SCALED_LIMITS = ("first_byte_timeout_seconds", "read_timeout_seconds")


@dataclass
class LiveSettings:
    """One live fairness benchmark (the defaults are the command's)."""

    pods: int = 4
    flood_tokens: int = 4096
    duration_s: float = 30.0  # simulated seconds of arrivals
    time_scale: float = 4.0  # wall seconds per simulated second
    short_weight: float = 1.0
    off: bool = False  # also run the flood without flow control
    seed: int = 0
    startup_timeout_s: float = 60.0


@dataclass
class RunRow:
    """One run of the table: what each tenant got, and how the client kept up."""

    run: str
    short: TargetSummary
    flood: TargetSummary | None
    refused_429: dict[str, int]  # tenant -> requests answered 429
    other_errors: int  # neither served nor 429 (timeouts, 5xx): should be 0
    generator: GeneratorHealth  # wall seconds
    # The generator's loop stalls while some `short` request was in flight (wall seconds): a
    # stall there can delay a first byte's time stamp; one after `short`'s last answer cannot.
    stalls_during_short: list[tuple[float, float]]

    @property
    def client_limited(self) -> bool:
        """More than 5% of the sends late, or a loop stall while `short` was in flight."""
        sent = self.short.requests + (0 if self.flood is None else self.flood.requests)
        return self.generator.late_sends > sent // 20 or bool(self.stalls_during_short)

    def to_json(self, alone_p99_s: float) -> dict[str, Any]:
        ratio = self.short.ttft_p99_s / alone_p99_s if alone_p99_s > 0 else math.nan
        return {
            "run": self.run,
            "short_ttft_p50_s": self.short.ttft_p50_s,
            "short_ttft_p99_s": self.short.ttft_p99_s,
            "p99_vs_alone": ratio,
            "short_served": self.short.completed,
            "short_requests": self.short.requests,
            "short_429": self.refused_429.get("short", 0),
            "flood_served": None if self.flood is None else self.flood.completed,
            "flood_requests": None if self.flood is None else self.flood.requests,
            "flood_429": None if self.flood is None else self.refused_429.get("flood", 0),
            "other_errors": self.other_errors,
            "send_lag": {
                **self.generator.to_json(),
                "stalls_during_short": self.stalls_during_short,
                "client_limited": self.client_limited,
            },
        }


@dataclass
class LiveFairness:
    settings: LiveSettings
    flood_requests: int
    flood_rate_rps: float
    rows: list[RunRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        alone = self.rows[0].short.ttft_p99_s if self.rows else math.nan
        return {
            "settings": asdict(self.settings),
            "flood_requests": self.flood_requests,
            "flood_rate_rps": self.flood_rate_rps,
            "rows": [_finite(row.to_json(alone)) for row in self.rows],
        }


def router_config(
    pod_urls: list[str], *, flow: bool, short_weight: float, time_scale: float
) -> dict[str, Any]:
    """The quick-start config of ``kvgate router --endpoint ... --policy kvgate`` (what the
    discrete-event bench routes with), plus the two tenants and flow control, its deadlines and
    timeouts stretched by ``time_scale``."""
    config = quickstart_config(pod_urls, MODEL, policy="kvgate", seed=0)
    data = config.model_dump(mode="json", exclude_unset=True)
    flow_defaults, limit_defaults = FlowControlConfig(), LimitsConfig()
    data["flow_control"] = {
        "enabled": flow,
        **{key: getattr(flow_defaults, key) * time_scale for key in SCALED_FLOW_CONTROL},
    }
    data["limits"] = {key: getattr(limit_defaults, key) * time_scale for key in SCALED_LIMITS}
    data["policy"]["max_affinity_wait_seconds"] = (
        PolicyConfig().max_affinity_wait_seconds * time_scale
    )
    data["tenants"] = tenants_config(short_weight)
    return data


async def run_live_fairness(settings: LiveSettings, out_dir: Path) -> LiveFairness:
    """Start the fleet, run each row's router and workload in turn, stop everything (even on an
    error or a cancel). ``out_dir`` receives the processes' logs, the router configs and each
    run's records (``records-<run>.jsonl``, wall seconds)."""
    scale = settings.time_scale
    workload = two_tenants(settings.pods, settings.flood_tokens, settings.seed, settings.duration_s)
    result = LiveFairness(settings, len(workload.flood), workload.flood_rate_rps)
    runs = [
        ("short alone", workload.alone, True),
        ("with flood, flow control", workload.both, True),
    ]
    if settings.off:
        runs.append(("with flood, no flow control", workload.both, False))
    fleet = SimFleet(
        settings.pods,
        MODEL,
        out_dir,
        extra_args=[f"--sim-time-scale={scale:g}"],
        startup_timeout_s=settings.startup_timeout_s,
    )
    # Idle connections are dropped before the servers drop theirs (as in the harness).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2)
    timeout_s = LimitsConfig().first_byte_timeout_seconds * scale
    await fleet.start()
    try:
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
            for index, (label, run_workload, flow) in enumerate(runs):
                log.info("run %d/%d: %s", index + 1, len(runs), label)
                if index > 0:
                    await fleet.reset_prefix_caches(client)
                config = router_config(
                    fleet.urls, flow=flow, short_weight=settings.short_weight, time_scale=scale
                )
                records, health = await _one_run(
                    client, f"router-{index}", config, run_workload, settings, out_dir, timeout_s
                )
                write_records(out_dir / f"records-{index}.jsonl", records)  # wall seconds
                result.rows.append(_row(label, records, health, scale))
    finally:
        await fleet.stop()
    return result


async def _one_run(
    client: httpx.AsyncClient,
    name: str,
    config: dict[str, Any],
    workload: Workload,
    settings: LiveSettings,
    out_dir: Path,
    timeout_s: float,
) -> tuple[list[RequestRecord], GeneratorHealth]:
    config_path = out_dir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    router = await start_config_router(
        name, config_path, out_dir, startup_timeout_s=settings.startup_timeout_s
    )
    try:
        generator = LoadGenerator(client, router.base_url, MODEL, request_timeout_s=timeout_s)
        return await generator.run(workload.stretched(settings.time_scale))
    finally:
        await router.stop()


def _row(label: str, records: list[RequestRecord], health: GeneratorHealth, scale: float) -> RunRow:
    by_tenant: dict[str, list[RequestRecord]] = {"short": [], "flood": []}
    for record in records:
        by_tenant[record.request_id.split("-", 1)[0]].append(rescaled(record, scale))
    refused = {t: sum(1 for r in recs if r.status == 429) for t, recs in by_tenant.items()}
    other = sum(1 for r in records if not r.ok and r.status != 429)
    short_wall = [r for r in records if r.request_id.startswith("short-")]
    first = min((r.sent_s for r in short_wall), default=0.0)
    last = max((r.end_s or r.sent_s for r in short_wall), default=0.0)
    return RunRow(
        run=label,
        short=summarize("short", by_tenant["short"]),
        flood=summarize("flood", by_tenant["flood"]) if by_tenant["flood"] else None,
        refused_429=refused,
        other_errors=other,
        generator=health,
        stalls_during_short=[
            (end, d) for end, d in health.loop_stalls if first < end and end - d < last
        ],
    )


def _finite(data: dict[str, Any]) -> dict[str, Any]:
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()
    }


def markdown(result: LiveFairness) -> str:
    """The table of docs/benchmarks.md (flow control, discrete-event), plus the client's lag."""
    s = result.settings
    lines = [
        f"{s.pods} pods, time scale {s.time_scale:g}, {s.duration_s:g} s of arrivals; flood of "
        f"{result.flood_requests} x {s.flood_tokens}-token prompts at "
        f"{result.flood_rate_rps:.1f} req/s; tenant short at weight {s.short_weight:g}",
        "",
        "| run | short TTFT p50 s | short TTFT p99 s | p99 / alone | short served "
        "| flood served / 429 | send lag max / mean s (wall) |",
        "|---|---|---|---|---|---|---|",
    ]
    alone = result.rows[0].short.ttft_p99_s if result.rows else math.nan
    for row in result.rows:
        short, flood = row.short, row.flood
        flood_cell = "-" if flood is None else f"{flood.completed} / {row.refused_429['flood']}"
        lag = row.generator
        lines.append(
            f"| {row.run} | {short.ttft_p50_s:.3f} | {short.ttft_p99_s:.3f} "
            f"| {short.ttft_p99_s / alone:.2f} | {short.completed}/{short.requests} "
            f"| {flood_cell} | {lag.max_send_lag_s:.3f} / {lag.mean_send_lag_s:.4f} |"
        )
    for row in result.rows:
        lag = row.generator
        if row.other_errors:
            lines.append(f"- {row.run}: {row.other_errors} requests failed (not 429)")
        after = len(lag.loop_stalls) - len(row.stalls_during_short)
        health = (
            f"{lag.late_sends} sends over 50 ms late; loop stalls over 0.25 s: "
            f"{len(row.stalls_during_short)} while short was in flight, {after} after "
            f"(max {lag.max_loop_lag_s:.3f} s)"
        )
        if row.client_limited:
            lines.append(
                f"- {row.run}: the load generator lagged ({health}): the client limited this "
                "run; raise --time-scale or lower --pods/--duration"
            )
        else:
            lines.append(f"- {row.run}: the client kept up ({health})")
    return "\n".join(lines)


async def _until_terminated(run: Coroutine[Any, Any, LiveFairness]) -> LiveFairness:
    """``run``, cancelled on SIGTERM as on Ctrl-C, so that its pods and router are stopped."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = LiveSettings()
    parser.add_argument("--pods", type=int, default=defaults.pods)
    parser.add_argument("--flood-tokens", type=int, default=defaults.flood_tokens)
    parser.add_argument(
        "--duration", type=float, default=defaults.duration_s, help="simulated s of arrivals"
    )
    parser.add_argument(
        "--time-scale", type=float, default=defaults.time_scale, help="wall s per simulated s"
    )
    parser.add_argument("--short-weight", type=float, default=defaults.short_weight)
    parser.add_argument("--off", action="store_true", help="also run without flow control")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, default=Path("out/flow-control-live"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    settings = LiveSettings(
        pods=args.pods,
        flood_tokens=args.flood_tokens,
        duration_s=args.duration,
        time_scale=args.time_scale,
        short_weight=args.short_weight,
        off=args.off,
        seed=args.seed,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_until_terminated(run_live_fairness(settings, args.out)))
    (args.out / "report.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    print(markdown(result))  # noqa: T201 - the benchmark's report
    log.info("report and logs in %s", args.out)


if __name__ == "__main__":
    main()
