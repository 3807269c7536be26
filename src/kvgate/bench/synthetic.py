"""Two synthetic stress workloads: hot-prefix skew, and mixed online + batch.

**hot-prefix**: one system prompt shared by most requests, the pile-up every prefix router is
known for. Each of ``num_requests`` requests starts with the hot prefix (probability
``hot_fraction``) or with one of ``cold_groups`` other prefixes (uniformly), then a unique
question; Poisson arrivals at ``rate_rps``. A router that follows the prefix alone sends ~90% of
the load to one pod; a good one spreads the hot prefix over as many pods as the load needs.

**mixed**: online chat traffic and an offline batch job at the same time. Online requests are
shared-prefix groups (``online_groups`` prefixes of ``online_prefix_len`` tokens + a
``online_question_len``-token question, ``online_output_len`` out) at ``online_rate_rps``;
batch requests are long documents (``batch_instruction_len`` shared instruction tokens + a unique
``batch_document_len``-token document, ``batch_output_len`` out) at ``batch_rate_rps``, marked
with request class ``batch``. Online latency is what matters; batch must not starve it.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from kvgate.bench.workload import (
    BenchRequest,
    Workload,
    completion_request,
    poisson_arrivals,
    random_tokens,
)


class HotPrefixParams(BaseModel):
    """Parameters of the hot-prefix workload."""

    model_config = ConfigDict(extra="forbid")

    num_requests: int = Field(default=1000, ge=1)
    hot_fraction: float = Field(
        default=0.9, ge=0, le=1, description="share of requests on the hot prefix"
    )
    prefix_len: int = Field(default=2048, ge=0, description="tokens in each prefix")
    cold_groups: int = Field(
        default=16, ge=1, description="other prefixes for the remaining requests"
    )
    question_len: int = Field(default=128, ge=1)
    output_len: int = Field(default=128, ge=1)
    rate_rps: float = Field(default=8.0, gt=0, description="Poisson arrival rate, requests/s")
    vocab_size: int = Field(default=32000, ge=2000, le=1 << 32)
    seed: int = 0


def build_hot_prefix(params: HotPrefixParams, name: str = "hot-prefix") -> Workload:
    rng = random.Random(params.seed)
    hot = random_tokens(rng, params.prefix_len, params.vocab_size)
    cold = [
        random_tokens(rng, params.prefix_len, params.vocab_size) for _ in range(params.cold_groups)
    ]
    arrivals = poisson_arrivals(params.num_requests, params.rate_rps, rng)
    requests: list[BenchRequest] = []
    for index, arrival in enumerate(arrivals):
        prefix = hot if rng.random() < params.hot_fraction else rng.choice(cold)
        question = random_tokens(rng, params.question_len, params.vocab_size)
        requests.append(
            completion_request(f"h{index}", prefix + question, params.output_len, arrival)
        )
    return Workload(
        name=name,
        requests=tuple(requests),
        description=(
            f"{params.num_requests} requests, {params.hot_fraction:.0%} on one "
            f"{params.prefix_len}-token prefix, Poisson {params.rate_rps:g} req/s"
        ),
        params=params.model_dump(),
    )


class MixedParams(BaseModel):
    """Parameters of the mixed online + batch workload."""

    model_config = ConfigDict(extra="forbid")

    duration_s: float = Field(default=60.0, gt=0, description="length of the arrival schedule")
    online_rate_rps: float = Field(default=6.0, gt=0)
    online_groups: int = Field(default=16, ge=1)
    online_prefix_len: int = Field(default=1024, ge=0)
    online_question_len: int = Field(default=64, ge=1)
    online_output_len: int = Field(default=128, ge=1)
    batch_rate_rps: float = Field(default=1.0, gt=0)
    batch_instruction_len: int = Field(default=512, ge=0)
    batch_document_len: int = Field(default=4096, ge=1)
    batch_output_len: int = Field(default=512, ge=1)
    vocab_size: int = Field(default=32000, ge=2000, le=1 << 32)
    seed: int = 0


def build_mixed(params: MixedParams, name: str = "mixed") -> Workload:
    rng = random.Random(params.seed)
    groups = [
        random_tokens(rng, params.online_prefix_len, params.vocab_size)
        for _ in range(params.online_groups)
    ]
    instruction = random_tokens(rng, params.batch_instruction_len, params.vocab_size)
    requests: list[BenchRequest] = []
    online_count = max(1, round(params.duration_s * params.online_rate_rps))
    for index, arrival in enumerate(poisson_arrivals(online_count, params.online_rate_rps, rng)):
        tokens = rng.choice(groups) + random_tokens(
            rng, params.online_question_len, params.vocab_size
        )
        requests.append(completion_request(f"o{index}", tokens, params.online_output_len, arrival))
    batch_count = max(1, round(params.duration_s * params.batch_rate_rps))
    for index, arrival in enumerate(poisson_arrivals(batch_count, params.batch_rate_rps, rng)):
        tokens = instruction + random_tokens(rng, params.batch_document_len, params.vocab_size)
        requests.append(
            completion_request(
                f"b{index}", tokens, params.batch_output_len, arrival, request_class="batch"
            )
        )
    requests.sort(key=lambda request: request.arrival_s)
    return Workload(
        name=name,
        requests=tuple(requests),
        description=(
            f"online {params.online_rate_rps:g} req/s over {params.online_groups} prefixes + "
            f"batch {params.batch_rate_rps:g} req/s of {params.batch_document_len}-token documents"
        ),
        params=params.model_dump(),
    )
