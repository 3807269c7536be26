"""One trace through the live router and through the discrete-event bench: the same decisions.

Live: the bench's per-pod fleet (`kvgate sim serve` processes publishing KV events) and a real
`kvgate router` process per policy, driven by the bench's load generator over HTTP. Simulated:
`kvgate.bench.des`, which runs the router's own routing core in virtual time. The trace is one
closed-loop session whose turns are sent one at a time with a pause between them (so that KV
events and load scrapes have arrived before each decision in both worlds), with shared and
unshared prefixes; every turn must go to the same pod in both runs, for every policy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.bench.des import run_des
from kvgate.bench.harness import HarnessSettings, run_live
from kvgate.bench.workload import COMPLETIONS, BenchRequest, Session, Workload

pytestmark = pytest.mark.integration

POLICIES = ["round-robin", "least-load", "prefix", "kvgate"]
SEED = 7
PODS = 3


def _trace() -> Workload:
    """4 groups with a 20-block shared prefix, 3 turns each, interleaved, plus two unique
    prompts: first turns spread over the pods, later turns find their group's holder."""
    order = [0, 1, 2, 3, 0, 1, 2, 3, None, 0, 1, 2, 3, None]
    turns = []
    for i, group in enumerate(order):
        if group is None:
            prompt = [20_000 + 97 * i + t for t in range(200)]
        else:
            prompt = [1_000 * (group + 1) + t for t in range(320)] + [30_000 + i] * 24
        turns.append(
            BenchRequest(
                request_id=f"t{i}",
                path=COMPLETIONS,
                body={"prompt": prompt, "max_tokens": 3},
                max_tokens=3,
                prefix_units=tuple(prompt),
                session_id="equivalence",
                think_time_s=0.6,
            )
        )
    return Workload("equivalence", sessions=(Session("equivalence", 0.0, tuple(turns)),))


async def test_the_live_router_and_the_discrete_event_bench_decide_alike(tmp_path: Path):
    workload = _trace()
    settings = HarnessSettings(
        pods=PODS,
        targets=POLICIES,
        kv_events=True,
        router_args=["--seed", str(SEED)],
        startup_timeout_s=60.0,
    )
    live = await run_live(workload, settings, tmp_path)
    # The simulated pods carry the live pods' ids (`host:port`): ties between equal pods are
    # broken by id in both worlds.
    ids = [url.removeprefix("http://") for url in live.pod_urls]
    for policy in POLICIES:
        simulated = run_des(workload, policy, PODS, seed=SEED, pod_names=ids)
        des_pods = {r.request_id: r.endpoint for r in simulated.records}
        records = live.records[policy]
        assert len(records) == len(workload.sessions[0].turns), policy
        assert all(r.ok for r in records), [(r.request_id, r.status, r.error) for r in records]
        live_pods = {r.request_id: r.endpoint for r in records}
        assert live_pods == des_pods, policy
        # Not a trivial trace: later turns were routed to their group's holder.
        assert len(set(des_pods.values())) == PODS, policy
