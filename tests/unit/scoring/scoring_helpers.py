"""Builders for scoring tests: endpoints, requests, random fleets."""

from __future__ import annotations

import random

from kvgate.scoring.base import (
    ChoiceHistory,
    CycleState,
    EndpointSnapshot,
    EngineLoad,
    RoutingRequest,
)
from kvgate.scoring.cost_model import CostModel


def endpoint(i: int | str, **kw: object) -> EndpointSnapshot:
    eid = i if isinstance(i, str) else f"pod-{i}"
    kw.setdefault("pool", "pool-a")
    return EndpointSnapshot(id=eid, **kw)


def fleet(n: int, **kw: object) -> list[EndpointSnapshot]:
    return [endpoint(i, **kw) for i in range(n)]


def request(prompt_tokens: int = 4096, block_tokens: int = 16, **kw: object) -> RoutingRequest:
    n_blocks = prompt_tokens // block_tokens
    keys = [i.to_bytes(32, "big") for i in range(n_blocks)]
    return RoutingRequest(
        model="m",
        prompt_tokens=prompt_tokens,
        block_tokens=block_tokens,
        block_keys=keys,
        **kw,
    )


def random_endpoint(rng: random.Random, i: int, now: float) -> EndpointSnapshot:
    engine = None
    if rng.random() < 0.8:
        engine = EngineLoad(
            waiting=rng.randint(0, 50),
            running=rng.randint(0, 300),
            kv_cache_usage=rng.random(),
        )
    in_flight = rng.randint(0, 100)
    return EndpointSnapshot(
        id=f"pod-{i}",
        pool=rng.choice(["a", "b"]),
        pool_class=rng.choice(["online", "batch"]),
        healthy=rng.random() < 0.9,
        draining=rng.random() < 0.1,
        in_flight=in_flight,
        batch_in_flight=rng.choice([0, rng.randint(0, in_flight)]),
        pending_prefill_requests=rng.randint(0, 10),
        pending_prefill_tokens=rng.randint(0, 200_000),
        engine=engine,
        prefill_tokens_per_second=rng.choice([None, rng.uniform(500, 50_000)]),
        max_num_seqs=rng.choice([None, 8, 256]),
    )


def random_case(
    rng: random.Random,
) -> tuple[RoutingRequest, list[EndpointSnapshot], dict[str, int], float]:
    now = rng.uniform(0, 1000)
    n = rng.randint(1, 20)
    endpoints = [random_endpoint(rng, i, now) for i in range(n)]
    # Scoring reads the directory's match counts, not the keys themselves: keep cases cheap.
    req = RoutingRequest(
        model="m",
        prompt_tokens=rng.randint(0, 40_000),
        block_tokens=rng.choice([1, 16, 64]),
        keys_exact=rng.random() < 0.7,
        request_class=rng.choice(["online", "batch"]),
        batch_waiting=rng.choice([0, rng.randint(1, 20)]),
    )
    matched = {e.id: rng.randint(0, 3000) for e in endpoints if rng.random() < 0.5}
    return req, endpoints, matched, now


def cycle_state(
    req: RoutingRequest,
    endpoints: list[EndpointSnapshot],
    matched: dict[str, int],
    now: float = 0.0,
    *,
    seed: int = 0,
    history: ChoiceHistory | None = None,
    model: CostModel | None = None,
) -> CycleState:
    est = (model or CostModel()).estimate_all(req, endpoints, matched)
    return CycleState(
        request=req,
        matched_blocks=matched,
        now=now,
        rng=random.Random(seed),
        history=history or ChoiceHistory(),
        estimates=est,
        max_hit_tokens=max((e.hit_tokens for e in est.values()), default=0),
    )
