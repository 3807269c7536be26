"""PNG plots of a benchmark run (matplotlib, Agg backend, no display needed).

- ``ttft_cdf.png``: empirical CDF of TTFT, one line per target (log x axis);
- ``hit_rate.png``: measured prefix-cache hit rate per target, the ideal bound as a dashed line;
- ``pod_load.png``: requests in each pod (running + waiting, from the pods' /metrics) over time,
  one panel per target: a flat band is balanced load, one tall line is a hot spot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvgate.bench.records import LoadSample, RequestRecord
from kvgate.bench.report import BenchReport

DPI = 80


def plot_ttft_cdf(records: Mapping[str, Sequence[RequestRecord]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for target, recs in records.items():
        ttfts = sorted(r.ttft_s for r in recs if r.ok and r.ttft_s is not None)
        if not ttfts:
            continue
        ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
        ax.step([max(t, 1e-4) for t in ttfts], ys, where="post", label=target)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_hit_rate(report: BenchReport, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(report.targets)
    rates = [report.targets[n].hit_rate for n in names]
    ax.bar(names, [r if math.isfinite(r) else 0.0 for r in rates], color="tab:blue")
    if math.isfinite(report.ideal_hit_rate):
        ax.axhline(
            report.ideal_hit_rate, color="black", linestyle="--", label="ideal (one infinite cache)"
        )
    if math.isfinite(report.finite_hit_rate):
        ax.axhline(
            report.finite_hit_rate,
            color="tab:red",
            linestyle=":",
            label="finite (one LRU cache, the fleet's KV size)",
        )
    if math.isfinite(report.ideal_hit_rate) or math.isfinite(report.finite_hit_rate):
        ax.legend(loc="best", fontsize="small")
    ax.set_ylim(0, 1)
    ax.set_ylabel("cached prompt tokens / prompt tokens")
    ax.set_title("prefix-cache hit rate (from the pods' usage)")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_pod_load(samples: Mapping[str, Sequence[LoadSample]], path: Path) -> None:
    targets = [t for t, s in samples.items() if s]
    if not targets:
        return
    fig, axes = plt.subplots(
        len(targets), 1, figsize=(6, 2.2 * len(targets)), sharex=True, squeeze=False
    )
    for ax, target in zip(axes[:, 0], targets, strict=True):
        by_pod: dict[str, list[LoadSample]] = {}
        for sample in samples[target]:
            by_pod.setdefault(sample.pod, []).append(sample)
        for pod, series in sorted(by_pod.items()):
            ax.plot(
                [s.t_s for s in series],
                [s.running + s.waiting for s in series],
                linewidth=0.8,
                label=pod,
            )
        ax.set_title(target, fontsize="small")
        ax.set_ylabel("requests")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since start")
    fig.suptitle("requests per pod (running + waiting)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_plots(
    report: BenchReport,
    records: Mapping[str, Sequence[RequestRecord]],
    samples: Mapping[str, Sequence[LoadSample]],
    out_dir: Path,
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "ttft_cdf.png", out_dir / "hit_rate.png", out_dir / "pod_load.png"]
    plot_ttft_cdf(records, paths[0])
    plot_hit_rate(report, paths[1])
    plot_pod_load(samples, paths[2])
    return [p for p in paths if p.exists()]
