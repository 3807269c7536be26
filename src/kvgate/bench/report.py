"""Report math: per-target summaries, the hit-rate bounds, report.json and a Markdown table.

Per target, over the requests that completed (``errors`` counts the others):

- ``ttft_mean_s``, ``ttft_p50_s``, ``ttft_p99_s``: time to first byte; percentiles interpolate
  linearly between order statistics (numpy's default);
- ``e2e_mean_s``, ``tpot_mean_s``;
- ``throughput_rps`` = completed requests / makespan and ``output_tps`` = generated tokens /
  makespan, where makespan runs from the first send to the last byte received;
- ``hit_rate`` = sum of ``cached_tokens`` / sum of ``prompt_tokens``, from the pods' ``usage``;
- ``classes``: where the requests are of more than one class (``online`` and ``batch``), the
  requests, errors, TTFT mean and p99, end-to-end mean and hit rate of each class apart (a batch
  document's wait says nothing about the online traffic beside it).

Bounds (:mod:`kvgate.bench.hit_bounds`), over the requests in the order the run sent them:
``ideal_hit_rate``, one infinite prefix cache shared by all pods (no router on any number of
finite pods can beat it), and ``finite_hit_rate``, one LRU cache the size of the whole fleet's KV
capacity (``kv_capacity_blocks``): what a router reaches when it wastes no capacity on copies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgate.bench.hit_bounds import hit_rate_bounds
from kvgate.bench.records import GeneratorHealth, RequestRecord
from kvgate.bench.workload import BenchRequest


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (0 <= q <= 100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class TargetSummary:
    target: str
    requests: int
    completed: int
    errors: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_mean_s: float
    tpot_mean_s: float
    throughput_rps: float
    output_tps: float
    hit_rate: float
    prompt_tokens: int
    cached_tokens: int
    makespan_s: float
    pods_used: dict[str, int] = field(default_factory=dict)
    generator: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, float | None] = field(default_factory=dict)  # pods' own histograms
    router: dict[str, float | None] = field(default_factory=dict)  # kvgate router's metrics
    classes: dict[str, dict[str, float | int | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in asdict(self).items()}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def summarize(
    target: str,
    records: Iterable[RequestRecord],
    health: GeneratorHealth | None = None,
    time_scale: float = 1.0,
) -> TargetSummary:
    """Summary of one target's records; times are divided by ``time_scale`` (simulated seconds
    when the fleet ran ``time_scale`` wall seconds per simulated second)."""
    records = [rescaled(r, time_scale) for r in records]
    done = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    e2es = [r.e2e_s for r in done if r.e2e_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    start = min((r.sent_s for r in records), default=0.0)
    end = max((r.end_s for r in done if r.end_s is not None), default=start)
    makespan = end - start
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    pods: dict[str, int] = {}
    for r in done:
        if r.endpoint:
            pods[r.endpoint] = pods.get(r.endpoint, 0) + 1
    return TargetSummary(
        target=target,
        requests=len(records),
        completed=len(done),
        errors=len(records) - len(done),
        ttft_mean_s=_mean(ttfts),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        e2e_mean_s=_mean(e2es),
        tpot_mean_s=_mean(tpots),
        throughput_rps=len(done) / makespan if makespan > 0 else math.nan,
        output_tps=sum(r.completion_tokens for r in done) / makespan if makespan > 0 else math.nan,
        hit_rate=cached / prompt if prompt else math.nan,
        prompt_tokens=prompt,
        cached_tokens=cached,
        makespan_s=makespan,
        pods_used=dict(sorted(pods.items())),
        generator=health.to_json() if health is not None else {},
        classes=_by_class(records),
    )


def _by_class(records: list[RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    """Each request class's own numbers, when there is more than one class (else empty)."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.request_class, []).append(r)
    if len(groups) < 2:
        return {}
    out: dict[str, dict[str, float | int | None]] = {}
    for name, group in sorted(groups.items()):
        s = summarize(name, group)  # one class: no classes of its own
        out[name] = {
            "requests": s.requests,
            "errors": s.errors,
            "ttft_mean_s": _finite(s.ttft_mean_s),
            "ttft_p99_s": _finite(s.ttft_p99_s),
            "e2e_mean_s": _finite(s.e2e_mean_s),
            "hit_rate": _finite(s.hit_rate),
        }
    return out


def rescaled(record: RequestRecord, time_scale: float) -> RequestRecord:
    """``record`` with its times divided by ``time_scale`` (wall -> simulated seconds)."""
    if time_scale == 1.0:
        return record

    def scale(value: float | None) -> float | None:
        return None if value is None else value / time_scale

    return replace(
        record,
        scheduled_s=record.scheduled_s / time_scale,
        sent_s=record.sent_s / time_scale,
        first_byte_s=scale(record.first_byte_s),
        end_s=scale(record.end_s),
    )


def ideal_hit_rate(requests: Iterable[BenchRequest], block_size: int = 16) -> float:
    """Hit rate of one infinite prefix cache over ``requests`` in the given order."""
    return hit_rate_bounds(requests, block_size).ideal


def finite_hit_rate(
    requests: Iterable[BenchRequest], capacity_blocks: int, block_size: int = 16
) -> float:
    """Hit rate of one LRU cache of ``capacity_blocks`` blocks over ``requests`` in order."""
    return hit_rate_bounds(requests, block_size, capacity_blocks).finite


def arrival_order(
    requests: Iterable[BenchRequest], records: Iterable[RequestRecord]
) -> list[BenchRequest]:
    """``requests`` in the order a run actually sent them, for the hit-rate bounds: unsent ones
    are dropped, and so are those answered 400 (a prompt over the pods' `max_model_len`: no
    pod serves it, so no cache can hit it; counted, they moved the bounds by up to 4% on the
    Mooncake trace, and a target could beat the ideal)."""
    by_id = {r.request_id: r for r in requests}
    sent = sorted(records, key=lambda r: r.sent_s)
    return [by_id[r.request_id] for r in sent if r.request_id in by_id and r.status != 400]


def unsent_notes(size: int, records: Mapping[str, Sequence[RequestRecord]]) -> list[str]:
    """A note for each target that sent fewer of the workload's `size` requests: a session
    ends at its first failed turn, as an agent whose call failed stops (a run cut by a
    duration leaves requests unsent anyway: its caller notes nothing then)."""
    return [
        f"{name}: {size - len(recs)} of {size} requests not sent (a session ends at its first "
        "failed turn)"
        for name, recs in records.items()
        if len(recs) < size
    ]


@dataclass
class BenchReport:
    workload: str
    description: str
    pods: int
    ideal_hit_rate: float
    targets: dict[str, TargetSummary]
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    finite_hit_rate: float = math.nan  # one LRU cache of kv_capacity_blocks (NaN: unknown)
    kv_capacity_blocks: int | None = None  # pods x usable KV blocks per pod

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "description": self.description,
            "pods": self.pods,
            "ideal_hit_rate": _finite(self.ideal_hit_rate),
            "finite_hit_rate": _finite(self.finite_hit_rate),
            "kv_capacity_blocks": self.kv_capacity_blocks,
            "settings": self.settings,
            "notes": self.notes,
            "targets": {name: s.to_json() for name, s in self.targets.items()},
        }

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "report.json"
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (out_dir / "report.md").write_text(markdown_table(self) + "\n")
        return path


def _fmt(value: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}"


def _opt(value: float | None) -> float:
    return math.nan if value is None else value


def _class_table(report: BenchReport) -> list[str]:
    """Each target's classes apart (no lines when every request is of one class)."""
    rows = [
        f"| {name} | {cls} | {c['requests']} | {_fmt(_opt(c['ttft_mean_s']))} "
        f"| {_fmt(_opt(c['ttft_p99_s']))} | {_fmt(_opt(c['e2e_mean_s']))} "
        f"| {_fmt(_opt(c['hit_rate']), 2)} | {c['errors']} |"
        for name, s in report.targets.items()
        for cls, c in s.classes.items()
    ]
    if not rows:
        return []
    return [
        "",
        "| target | class | requests | TTFT mean s | TTFT p99 s | e2e mean s | hit rate | errors |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def markdown_table(report: BenchReport) -> str:
    """One row per target; ratios against the first target (the baseline)."""
    lines = [
        f"Workload `{report.workload}` on {report.pods} pods: {report.description}",
        "",
        "| target | TTFT mean s | TTFT p50 s | TTFT p99 s | pods' TTFT mean s | e2e mean s "
        f"| req/s | out tok/s | hit rate (ideal {_fmt(report.ideal_hit_rate, 2)}, "
        f"finite {_fmt(report.finite_hit_rate, 2)}) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in report.targets.items():
        lines.append(
            f"| {name} | {_fmt(s.ttft_mean_s)} | {_fmt(s.ttft_p50_s)} | {_fmt(s.ttft_p99_s)} "
            f"| {_fmt(_opt(s.engine.get('ttft_mean_s')))} | {_fmt(s.e2e_mean_s)} | {_fmt(s.throughput_rps, 2)} | {_fmt(s.output_tps, 0)} "
            f"| {_fmt(s.hit_rate, 2)} | {s.errors} |"
        )
    names = list(report.targets)
    if len(names) > 1:
        base = report.targets[names[0]]
        lines.append("")
        for name in names[1:]:
            s = report.targets[name]
            if base.ttft_mean_s > 0 and math.isfinite(s.ttft_mean_s):
                lines.append(
                    f"- {name}: mean TTFT {s.ttft_mean_s / base.ttft_mean_s:.2f}x {names[0]}'s, "
                    f"p99 {s.ttft_p99_s / base.ttft_p99_s:.2f}x"
                )
    lines.extend(_class_table(report))
    for name, s in report.targets.items():
        steps = s.engine.get("decodes_per_prefill_step")
        if steps is not None:
            share = _opt(s.engine.get("prefill_step_share"))
            preemptions = _opt(s.engine.get("preemptions"))
            lines.append(
                f"- {name} engines: {steps:.1f} decodes held up per prefill step, "
                f"{_fmt(share * 100, 0)}% of busy time in prefill steps, "
                f"{_fmt(preemptions, 0)} preemptions"
            )
    lines.extend(f"- note: {note}" for note in report.notes)
    return "\n".join(lines)
