"""The live benchmark: one fleet, one workload, several targets, one after the other.

For each target in order:

1. make the fleet cold: restart it (``fresh_fleet``) or ``POST /reset_prefix_cache`` on every pod;
2. start the target (a router process) in front of the pods and wait for its health endpoint;
3. start the pod-load sampler, replay the workload (same arrivals, same bodies for every target)
   with the load generator, stop the sampler;
4. stop the target.

Then (:func:`write_outputs`, outside the event loop): the hit-rate bounds over the workload in the
order the first target sent it (ideal, and finite with the pods' KV capacity read from their
``vllm:cache_config_info``), the per-target summaries, ``report.json``, ``report.md``, ``records-<target>.jsonl`` and the plots.
A target that cannot start is reported with its error (``start_error``) and the others still run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from kvgate.bench.clients import run_clients
from kvgate.bench.fleet import (
    ENGINE_COUNTERS,
    PodLoadSampler,
    SimFleet,
    mean_from_delta,
    scrape_kv_capacity_blocks,
    scrape_sums,
    sum_metrics,
)
from kvgate.bench.hit_bounds import hit_rate_bounds
from kvgate.bench.loadgen import ProgressCallback, http_client
from kvgate.bench.plots import write_plots
from kvgate.bench.processes import StartError
from kvgate.bench.records import LoadSample, RequestRecord
from kvgate.bench.report import (
    BenchReport,
    TargetSummary,
    arrival_order,
    rescaled,
    summarize,
    unsent_notes,
)
from kvgate.bench.targets import kvgate_policies, start_target
from kvgate.bench.workload import Workload

log = logging.getLogger(__name__)


@dataclass
class HarnessSettings:
    """How a live benchmark runs (the defaults are the CLI's)."""

    pods: int = 4
    model: str = "sim-model"
    targets: list[str] = field(default_factory=lambda: ["round-robin", "kvgate"])
    duration_s: float | None = None  # simulated seconds of sending; None = the whole workload
    fresh_fleet: bool = False
    block_size: int = 16
    request_timeout_s: float = 300.0
    sample_interval_s: float = 0.5
    time_scale: float = 1.0  # the fleet's --sim-time-scale; reports are in simulated seconds
    clients: int = 1  # load-generator processes on one schedule (`clients.py`)
    tokenizer: str | None = None  # tokenizer dir for pods and kvgate routers (exact keys)
    kv_events: bool = False  # pods publish KV events; kvgate routers subscribe
    fleet_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 60.0


@dataclass
class LiveRun:
    """What the targets did; :func:`write_outputs` turns it into files."""

    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    samples: dict[str, list[LoadSample]] = field(default_factory=dict)
    summaries: dict[str, TargetSummary] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    pod_urls: list[str] = field(default_factory=list)  # in the order every target was given them
    kv_capacity_blocks: int | None = None  # the pods' usable KV blocks, summed (None: unknown)


@dataclass
class BenchResult:
    report: BenchReport
    plots: list[Path]
    report_path: Path


# Called when a target starts (name, its index, how many there are).
TargetCallback = Callable[[str, int, int], None]


async def run_live(
    workload: Workload,
    settings: HarnessSettings,
    log_dir: Path,
    *,
    on_target: TargetCallback | None = None,
    progress: ProgressCallback | None = None,
) -> LiveRun:
    """Run every target in turn (``log_dir`` receives the child processes' logs)."""
    logs = log_dir
    scale = settings.time_scale
    fleet_args = list(settings.fleet_args)
    if scale != 1.0:
        fleet_args.append(f"--sim-time-scale={scale:g}")
    if settings.tokenizer is not None:
        fleet_args += ["--tokenizer", settings.tokenizer]
    wall_workload = workload.stretched(scale)
    fleet = SimFleet(
        settings.pods,
        settings.model,
        logs,
        extra_args=fleet_args,
        startup_timeout_s=settings.startup_timeout_s,
        kv_events=settings.kv_events,
    )
    run = LiveRun()
    records, samples, summaries, notes = run.records, run.samples, run.summaries, run.notes
    await fleet.start()
    run.pod_urls = list(fleet.urls)
    try:
        async with http_client(settings.request_timeout_s) as client:
            run.kv_capacity_blocks = await scrape_kv_capacity_blocks(client, fleet.urls)
            for index, name in enumerate(settings.targets):
                if on_target is not None:
                    on_target(name, index, len(settings.targets))
                if index > 0:
                    if settings.fresh_fleet:
                        await fleet.restart()
                    else:
                        await fleet.reset_prefix_caches(client)
                try:
                    target = await start_target(
                        name,
                        fleet.urls,
                        settings.model,
                        logs,
                        startup_timeout_s=settings.startup_timeout_s,
                        extra_args=kvgate_router_args(settings, fleet)
                        if name in kvgate_policies()
                        else None,
                    )
                except StartError as exc:
                    log.error("target %s did not start: %s", name, exc)
                    notes.append(f"{name} did not start: {str(exc).splitlines()[0]}")
                    continue
                engine_before = await scrape_sums(client, fleet.urls, ENGINE_COUNTERS)
                sampler = PodLoadSampler(client, fleet.urls, settings.sample_interval_s)
                sampler.start()
                router_stats: dict[str, float | None] = {}
                try:
                    wall_records, health = await run_clients(
                        client,
                        target.base_url,
                        settings.model,
                        wall_workload,
                        clients=settings.clients,
                        duration_s=None
                        if settings.duration_s is None
                        else settings.duration_s * scale,
                        request_timeout_s=settings.request_timeout_s,
                        progress=progress,
                    )
                    if name in kvgate_policies():
                        router_stats = await _router_stats(client, target.base_url, scale)
                finally:
                    samples[name] = [replace(s, t_s=s.t_s / scale) for s in await sampler.stop()]
                    await target.stop()
                recs = [rescaled(r, scale) for r in wall_records]
                records[name] = recs
                engine_after = await scrape_sums(client, fleet.urls, ENGINE_COUNTERS)
                summary = summarize(name, recs, health)
                summary.engine = {
                    # the pods' own histograms: what the GPUs did, without router or client
                    "ttft_mean_s": mean_from_delta(
                        engine_before, engine_after, "vllm:time_to_first_token_seconds"
                    ),
                    "queue_mean_s": mean_from_delta(
                        engine_before, engine_after, "vllm:request_queue_time_seconds"
                    ),
                    "e2e_mean_s": mean_from_delta(
                        engine_before, engine_after, "vllm:e2e_request_latency_seconds"
                    ),
                }
                summary.router = router_stats
                summaries[name] = summary
                if health.client_limited(len(recs)):
                    notes.append(
                        f"{name}: the load generator lagged (max send lag "
                        f"{health.max_send_lag_s:.3f}s, loop stall {health.max_loop_lag_s:.3f}s, "
                        f"{health.late_sends} late sends over {settings.clients} client "
                        "process(es)): the client limited this run; rerun with more --clients "
                        "or a larger --time-scale"
                    )
    finally:
        await fleet.stop()
    return run


def write_outputs(
    workload: Workload, settings: HarnessSettings, run: LiveRun, out_dir: Path
) -> BenchResult:
    """report.json, report.md, records-<target>.jsonl and the plots, in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(run.records.values()), [])
    order = (
        arrival_order(workload.all_requests(), first) if first else list(workload.all_requests())
    )
    bounds = hit_rate_bounds(order, settings.block_size, run.kv_capacity_blocks)
    report = BenchReport(
        workload=workload.name,
        description=workload.description,
        pods=settings.pods,
        ideal_hit_rate=bounds.ideal,
        finite_hit_rate=bounds.finite,
        kv_capacity_blocks=bounds.capacity_blocks,
        targets=run.summaries,
        settings={
            "mode": "live",
            "targets": settings.targets,
            "duration_s": settings.duration_s,
            "fresh_fleet": settings.fresh_fleet,
            "time_scale": settings.time_scale,
            "clients": settings.clients,
            "fleet_args": settings.fleet_args,
            "tokenizer": settings.tokenizer,
            "kv_events": settings.kv_events,
            "router_args": settings.router_args,
            "workload_params": workload.params,
        },
        # with a duration, requests left unsent are the cut's (failed turns are errors anyway)
        notes=[
            *run.notes,
            *(unsent_notes(workload.size, run.records) if settings.duration_s is None else ()),
        ],
    )
    report_path = report.write(out_dir)
    for name, recs in run.records.items():
        write_records(out_dir / f"records-{name}.jsonl", recs)
    plots = write_plots(report, run.records, run.samples, out_dir)
    return BenchResult(report, plots, report_path)


COPIES = "kvgate_router_prefix_copies_total"
ROUTER_COUNTERS = (
    "kvgate_router_decision_latency_seconds_sum",
    "kvgate_router_decision_latency_seconds_count",
    "kvgate_router_ttft_seconds_sum",
    "kvgate_router_ttft_seconds_count",
)


async def _router_stats(
    client: httpx.AsyncClient, base_url: str, scale: float
) -> dict[str, float | None]:
    """kvgate's own view: mean decision time (wall), mean TTFT it measured (simulated s) and
    the prefix copies it made (answered)."""
    zero = dict.fromkeys(ROUTER_COUNTERS, 0.0)
    try:
        page = (await client.get(base_url + "/metrics", timeout=5.0)).text
    except httpx.HTTPError:
        page = ""  # every counter reads 0
    sums = sum_metrics(page, ROUTER_COUNTERS)
    copies = sum_metrics(page, (COPIES,), where={"result": "ok"})
    return {
        "decision_mean_s": mean_from_delta(zero, sums, "kvgate_router_decision_latency_seconds"),
        "ttft_mean_s": mean_from_delta(zero, sums, "kvgate_router_ttft_seconds", scale),
        "prefix_copies": copies[COPIES],
    }


def kvgate_router_args(settings: HarnessSettings, fleet: SimFleet) -> list[str]:
    """Extra `kvgate router` flags: the fleet's tokenizer, KV event sockets, the user's args."""
    args: list[str] = []
    if settings.tokenizer is not None:
        args += ["--tokenizer", settings.tokenizer]
    for url, socket in zip(fleet.urls, fleet.kv_event_sockets, strict=False):
        args += ["--kv-events", f"{url}={socket}"]
    return args + list(settings.router_args)


def write_records(path: Path, records: list[RequestRecord]) -> None:
    """One JSON object a line, in the order the requests were sent."""
    with path.open("w") as handle:
        for record in sorted(records, key=lambda r: r.sent_s):
            handle.write(json.dumps(record.to_json()) + "\n")
