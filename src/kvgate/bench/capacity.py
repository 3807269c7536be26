"""Fleet capacity for a workload, so that benchmarks run at a stated share of it (70-80%).

Definition: the capacity of ``pods`` pods for a workload is the throughput (requests/s) the fleet
sustains under **round robin** when every request is already waiting: request *i* goes to pod
``i mod pods``, all arrive at time 0, each pod's simulated engine (the same engine, profile and
scheduler as ``kvgate sim``) runs until idle, and capacity = requests / the slowest pod's
makespan. Round robin's share of prefix hits is what a cache-blind router gets; a cache-aware
router needs less prefill per request and so has headroom above this number, which is the point.

``sample`` requests (evenly spaced through the workload) are used to keep this quick; the rate for
a load level is ``load x capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.bench.workload import BenchRequest, Workload
from kvgate.sim.engine import EngineConfig, RequestRejected, SimEngine
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import DEFAULT_PROFILE, load_profile


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float
    output_tokens_per_s: float
    sampled_requests: int


def _sample(requests: list[BenchRequest], sample: int) -> list[BenchRequest]:
    if len(requests) <= sample:
        return requests
    step = len(requests) / sample
    return [requests[int(i * step)] for i in range(sample)]


def fleet_capacity(
    workload: Workload,
    pods: int,
    *,
    profile: str = DEFAULT_PROFILE,
    engine: EngineConfig | None = None,
    sample: int = 2000,
) -> Capacity:
    """Round-robin saturation throughput of ``pods`` simulated pods on ``workload``."""
    requests = _sample(list(workload.all_requests()), sample)
    if not requests:
        raise ValueError("the workload is empty")
    perf = load_profile(profile)
    config = engine or EngineConfig()
    engines = [
        SimEngine(config, perf, PrefixBlockHasher("sha256", config.block_size, None))
        for _ in range(pods)
    ]
    accepted: list[BenchRequest] = []
    for request in requests:
        try:  # a prompt the engine refuses (over max_model_len) is no work for it
            engines[len(accepted) % pods].add_request(
                request.request_id, list(request.prefix_units), request.max_tokens, 0.0
            )
        except RequestRejected:
            continue
        accepted.append(request)
    requests = accepted
    makespan = 0.0
    for sim in engines:
        steps = sim.run_until_idle(0.0)
        if steps:
            makespan = max(makespan, steps[-1].end)
    output = sum(r.max_tokens for r in requests)
    return Capacity(
        requests_per_s=len(requests) / makespan if makespan > 0 else float("inf"),
        output_tokens_per_s=output / makespan if makespan > 0 else float("inf"),
        sampled_requests=len(requests),
    )
