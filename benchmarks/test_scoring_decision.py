"""Decision time of the scoring step alone (no tokenization, hashing or directory lookup).

    .venv/bin/python -m pytest benchmarks/test_scoring_decision.py --benchmark-only -q -s

16 pods with engine-reported load, learned prefill rates, router in-flight and pending-prefill
counts; the directory answer names `holders` pods holding part of the prompt. Each round is one
`policy.decide(...)` followed by `history.record(...)`, as the router does. Besides
pytest-benchmark's table, each case prints its p50/p99 over 20,000 decisions (perf_counter_ns).
"""

from __future__ import annotations

import random
import time

import pytest

from kvgate.scoring import ChoiceHistory, EndpointSnapshot, EngineLoad, RoutingRequest
from kvgate.scoring.output_length import OutputLengthEstimator, OutputLengthParams
from kvgate.scoring.registry import build_policy

PODS = 16


def _fleet(rng: random.Random) -> list[EndpointSnapshot]:
    return [
        EndpointSnapshot(
            id=f"default/engine-{i}",
            pool="default/llama",
            in_flight=rng.randint(0, 40),
            pending_prefill_requests=rng.randint(0, 4),
            pending_prefill_tokens=rng.randint(0, 30_000),
            engine=EngineLoad(
                waiting=rng.randint(0, 6),
                running=rng.randint(0, 64),
                kv_cache_usage=rng.random(),
                kv_capacity_tokens=400_000,
            ),
            prefill_tokens_per_second=rng.uniform(8_000, 14_000),
            max_num_seqs=256,
        )
        for i in range(PODS)
    ]


CASES = {
    # name: (prompt tokens, pods holding part of it)
    "2k-prompt-3-holders": (2048, 3),
    "32k-agent-turn-1-holder": (32768, 1),
    "32k-cold": (32768, 0),
}


def _setup(policy_name: str, case: str):  # type: ignore[no-untyped-def]
    prompt, holders = CASES[case]
    rng = random.Random(0)
    eps = _fleet(rng)
    long_answers = policy_name == "kvgate-long-answers"
    policy = build_policy("kvgate" if long_answers else policy_name)
    # the pool's answers, long next to their prompts (a reasoning model's) or short; the
    # expected output as the router asks for it: priced only where long, by a policy that
    # prices the decode (`kvgate`)
    answers = OutputLengthEstimator()
    for _ in range(OutputLengthParams().min_answers):
        answers.observe("default/llama", 1800 if long_answers else 300, 2800)
    output = answers.expected("default/llama", None, policy.decode_min_output_ratio)
    req = RoutingRequest(
        model="llama", prompt_tokens=prompt, block_tokens=16, expected_output_tokens=output
    )
    matched = {eps[i].id: rng.randint(1, prompt // 16) for i in range(holders)}
    history = ChoiceHistory()
    decide_rng = random.Random(1)

    def one() -> str:
        d = policy.decide(req, eps, matched, now=100.0, rng=decide_rng, history=history)
        history.record(d.endpoint_id)
        return d.endpoint_id

    return one


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "policy_name", ["kvgate", "kvgate-long-answers", "prefix", "least-load", "round-robin"]
)
def test_decision_time_16_pods(benchmark, policy_name, case):  # type: ignore[no-untyped-def]
    one = _setup(policy_name, case)
    for _ in range(200):
        one()
    samples = []
    for _ in range(20_000):
        t0 = time.perf_counter_ns()
        one()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    p50 = samples[len(samples) // 2] / 1000
    p99 = samples[int(len(samples) * 0.99)] / 1000
    benchmark.extra_info.update({"p50_us": p50, "p99_us": p99})
    print(f"\n{policy_name:20s} {case:26s} p50 {p50:7.1f} us  p99 {p99:7.1f} us")
    benchmark(one)
