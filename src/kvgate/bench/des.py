"""Discrete-event benchmark: kvgate's own routing core in front of simulated engines, no HTTP.

:func:`run_des` runs one policy over one workload on a :class:`kvgate.sim.des.DESFleet` driven
by :class:`kvgate.bench.des_driver.RouterDriver` (the router's ``RoutingCore`` and the
directory's subscriber code, in virtual time); :func:`des_report` runs every target of a bench
and adds the hit-rate bounds, so live and discrete-event runs share the report code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
from kvgate.bench.des_driver import ProgressFn, RouterDriver
from kvgate.bench.hit_bounds import fleet_kv_blocks, hit_rate_bounds
from kvgate.bench.records import GeneratorHealth, LoadSample, RequestRecord
from kvgate.bench.report import BenchReport, arrival_order, summarize, unsent_notes
from kvgate.bench.targets import kvgate_policies
from kvgate.bench.workload import Workload
from kvgate.scoring.registry import default_registry
from kvgate.sim.des import DESFleet
from kvgate.sim.engine import EngineConfig, SimEngine, kv_cache_blocks
from kvgate.sim.profile import DEFAULT_PROFILE, load_profile


@dataclass
class DesResult:
    records: list[RequestRecord]
    samples: list[LoadSample]
    decisions: list[tuple[str, str, str, int]] = field(default_factory=list)
    # (request id, endpoint, reason, predicted hit tokens), in decision order
    health: GeneratorHealth = field(default_factory=GeneratorHealth)
    peak_kv_usage: float = 0.0  # the largest KV-cache usage of any pod at a scrape tick
    warm_requests: int = 0  # warm requests sent to pods that joined (all replicas)
    engine: dict[str, float] = field(default_factory=dict)  # engine_steps() of the fleet


def engine_steps(engines: Sequence[SimEngine]) -> dict[str, float]:
    """Where the fleet's decode time went, over every pod: ``preemptions``;
    ``decodes_per_prefill_step``, the decoding sequences a step that computes prompt tokens
    holds up on average (each waits out that step's prefill chunk: where prefills land next to
    many decodes, end-to-end time grows even when TTFT does not); ``prefill_step_share``, the
    share of busy time spent in such steps."""
    stats = [e.stats for e in engines]
    prefill_steps = sum(s.prefill_steps for s in stats)
    busy = sum(s.busy_seconds for s in stats)
    return {
        "preemptions": float(sum(s.preemptions for s in stats)),
        "decodes_per_prefill_step": (
            sum(s.decodes_in_prefill_steps for s in stats) / prefill_steps if prefill_steps else 0.0
        ),
        "prefill_step_share": sum(s.prefill_step_seconds for s in stats) / busy if busy else 0.0,
    }


def run_des(
    workload: Workload,
    policy: str,
    pods: int,
    *,
    seed: int = 0,
    profile: str = DEFAULT_PROFILE,
    engine: EngineConfig | None = None,
    progress: ProgressFn | None = None,
    policy_params: dict[str, Any] | None = None,
    pod_names: list[str] | None = None,
    cache_ops: bool = False,
    config_update: dict[str, Any] | None = None,
    pool_class: str = "online",
    cpu_offload: bool = False,
    scale: Sequence[tuple[float, int]] = (),
    warmup: WarmupConfig | None = None,
    replicas: int = 1,
    load_sharing: LoadSharingConfig | None = None,
) -> DesResult:
    """One policy over one workload on ``pods`` simulated engines, named ``pod-<i>`` or
    ``pod_names`` (endpoint ids: tie-breaks between equal pods go by id); ``cache_ops``: the
    engines accept AKV cache ops (``--sim-akv``); ``config_update``: router config sections
    over the quick-start's (tenants, flow_control, ...); ``pool_class``: the class of the
    fleet's one pool; ``cpu_offload``: the router prices the engines' CPU offloading tier
    (``engine.kv_offloading_size_gib``); ``scale``: at time t, n more pods join (``pod-<i>``);
    ``warmup``: the router's warm-up settings (default: its config's); ``replicas``: router
    replicas behind one Service (each request goes to one at random), exchanging their loads as
    ``load_sharing`` says (None, or ``enabled: false``: not at all) and sharing warm-ups unless
    ``warmup.shared`` is false."""
    known = default_registry().names("policy")
    if policy not in known:
        raise ValueError(f"policy {policy!r} cannot run in des mode ({', '.join(known)})")
    fleet = DESFleet(
        pods, engine or EngineConfig(), load_profile(profile), names=pod_names, cache_ops=cache_ops
    )
    driver = RouterDriver(
        fleet,
        policy,
        seed=seed,
        policy_params=policy_params,
        progress=progress,
        config_update=config_update,
        pool_class=pool_class,
        cpu_offload=cpu_offload,
        scale=scale,
        warmup=warmup,
        replicas=replicas,
        load_sharing=load_sharing,
    )
    try:
        fleet.run(driver.trace(workload), driver)
    finally:
        driver.close()
    return DesResult(
        records=driver.records,
        samples=driver.samples,
        decisions=driver.decisions,
        peak_kv_usage=driver.peak_kv_usage,
        warm_requests=driver.warmups.sent,
        engine=engine_steps(fleet.engines),
    )


def des_report(
    workload: Workload,
    pods: int,
    targets: list[str],
    *,
    seed: int = 0,
    block_size: int = 16,
    on_target: Callable[[str], ProgressFn] | None = None,
    policy_params: dict[str, Any] | None = None,
) -> tuple[BenchReport, dict[str, list[RequestRecord]], dict[str, list[LoadSample]]]:
    """Run every target that can run in des mode; the others are named in the report's notes."""
    summaries = {}
    records: dict[str, list[RequestRecord]] = {}
    samples: dict[str, list[LoadSample]] = {}
    notes = []
    runnable = kvgate_policies()
    for name in targets:
        if name not in runnable:
            notes.append(f"{name} is not a kvgate scoring policy and cannot run in des mode")
            continue
        progress = on_target(name) if on_target is not None else None
        params = policy_params if name == "kvgate" else None
        result = run_des(
            workload,
            name,
            pods,
            seed=seed,
            engine=EngineConfig(block_size=block_size),
            progress=progress,
            policy_params=params,
        )
        records[name] = result.records
        samples[name] = result.samples
        summary = summarize(name, result.records)
        # in simulated time the client's TTFT is the engine's own
        summary.engine = {"ttft_mean_s": summary.ttft_mean_s, **result.engine}
        summaries[name] = summary
    first = next(iter(records.values()), [])
    order = arrival_order(workload.all_requests(), first)
    blocks_per_pod = kv_cache_blocks(
        EngineConfig(block_size=block_size), load_profile(DEFAULT_PROFILE)
    )
    bounds = hit_rate_bounds(order, block_size, fleet_kv_blocks(pods, blocks_per_pod))
    report = BenchReport(
        workload=workload.name,
        description=workload.description,
        pods=pods,
        ideal_hit_rate=bounds.ideal,
        finite_hit_rate=bounds.finite,
        kv_capacity_blocks=bounds.capacity_blocks,
        targets=summaries,
        settings={
            "mode": "des",
            "targets": targets,
            "seed": seed,
            "workload_params": workload.params,
            **({"policy_params": policy_params} if policy_params else {}),
        },
        notes=[*notes, *unsent_notes(workload.size, records)],
    )
    return report, records, samples
