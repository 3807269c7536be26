"""Shared-prefix groups: many prompts that start with one of a few long system prompts.

Algorithm (as SGLang's ``generated-shared-prefix`` dataset and llm-d's precise-prefix benchmark):
draw ``num_groups`` random system prompts of ``system_prompt_len`` tokens; for each group draw
``prompts_per_group`` random questions of ``question_len`` tokens; each request is system prompt +
question and asks for ``output_len`` tokens. All requests are shuffled and sent open loop with
Poisson arrivals at ``rate_rps``. Token ids are random, so the only sharing is the group prefix.

Two presets: :data:`SGLANG_GSP` (64 x 16, 2048 + 128 tokens, 256 out) and
:data:`LLMD_PRECISE_PREFIX` (150 x 5, 6000 + 1200 tokens, 1000 out).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from kvgate.bench.workload import Workload, completion_request, poisson_arrivals, random_tokens


class SharedPrefixParams(BaseModel):
    """Parameters of the shared-prefix workload (defaults: SGLang generated-shared-prefix)."""

    model_config = ConfigDict(extra="forbid")

    num_groups: int = Field(default=64, ge=1, description="distinct system prompts")
    prompts_per_group: int = Field(default=16, ge=1, description="questions per system prompt")
    system_prompt_len: int = Field(default=2048, ge=0, description="tokens in each system prompt")
    question_len: int = Field(default=128, ge=1, description="tokens in each question")
    output_len: int = Field(default=256, ge=1, description="tokens generated per request")
    rate_rps: float = Field(default=8.0, gt=0, description="Poisson arrival rate, requests/s")
    vocab_size: int = Field(
        default=32000, ge=2000, le=1 << 32, description="token ids are drawn below this"
    )
    seed: int = Field(default=0, description="seed of every random choice")


SGLANG_GSP = SharedPrefixParams()
LLMD_PRECISE_PREFIX = SharedPrefixParams(
    num_groups=150,
    prompts_per_group=5,
    system_prompt_len=6000,
    question_len=1200,
    output_len=1000,
)


def build_shared_prefix(params: SharedPrefixParams, name: str = "shared-prefix") -> Workload:
    rng = random.Random(params.seed)
    prompts: list[tuple[int, list[int]]] = []
    for group in range(params.num_groups):
        system = random_tokens(rng, params.system_prompt_len, params.vocab_size)
        for _ in range(params.prompts_per_group):
            question = random_tokens(rng, params.question_len, params.vocab_size)
            prompts.append((group, system + question))
    rng.shuffle(prompts)
    arrivals = poisson_arrivals(len(prompts), params.rate_rps, rng)
    requests = tuple(
        completion_request(f"g{group}-{index}", tokens, params.output_len, arrival)
        for index, ((group, tokens), arrival) in enumerate(zip(prompts, arrivals, strict=True))
    )
    return Workload(
        name=name,
        requests=requests,
        description=(
            f"{params.num_groups} groups x {params.prompts_per_group} prompts, "
            f"{params.system_prompt_len}-token shared prefix + {params.question_len}-token "
            f"question, {params.output_len} output tokens, Poisson {params.rate_rps:g} req/s"
        ),
        params=params.model_dump(),
    )
