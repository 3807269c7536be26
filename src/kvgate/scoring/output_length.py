"""Online estimate of how many tokens a pool's answers run to, and how long they are next to
their prompts.

The cost model prices the decode a request will do on each pod (``decode_seconds``): its
expected output tokens x the time each decode step there spends reading the KV cache of the
requests already running. The router cannot know one request's output length in advance; it
learns each pool's mean from the ``usage.completion_tokens`` of the answers it relays (an
exponentially weighted mean, ``alpha`` per answer), capped by the request's own ``max_tokens``
when it sets one. The same answers' ``usage.prompt_tokens`` give the pool's mean prompt, and
``output_ratio`` is the one mean over the other: the policy charges the decode price only in
pools whose answers are long next to their prompts (reasoning models), where a lighter decode
saves more completion time than the TTFT it costs. Until a pool has ``min_answers`` answers
both are 0: no decode price. Memory: two floats and one count per pool (pools come from the
router's configuration). No clock reads, no I/O: the router owns one instance and feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class OutputLengthParams(BaseModel):
    """Parameters of the output-length estimator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.05, gt=0, le=1)
    """Weight of one answer in the mean (0.05: about the last 20 answers count most)."""
    min_answers: int = Field(default=8, ge=1)
    """Answers needed before the pool's mean is used."""


@dataclass(slots=True)
class _PoolMean:
    tokens: float
    prompt_tokens: float
    answers: int


class OutputLengthEstimator:
    """Per-pool EWMA of completion tokens. Not thread-safe; one per router process."""

    __slots__ = ("_pools", "params")

    def __init__(self, params: OutputLengthParams | None = None) -> None:
        self.params = params or OutputLengthParams()
        self._pools: dict[str, _PoolMean] = {}

    def observe(self, pool: str, completion_tokens: int, prompt_tokens: int) -> None:
        """Record one whole answer of ``completion_tokens`` tokens from ``pool``, to a prompt
        of ``prompt_tokens``."""
        if completion_tokens < 0 or prompt_tokens < 0:
            return
        mean = self._pools.get(pool)
        if mean is None:
            self._pools[pool] = _PoolMean(float(completion_tokens), float(prompt_tokens), 1)
            return
        alpha = self.params.alpha
        mean.tokens += alpha * (completion_tokens - mean.tokens)
        mean.prompt_tokens += alpha * (prompt_tokens - mean.prompt_tokens)
        mean.answers += 1

    def expected(
        self, pool: str, max_tokens: int | None = None, min_ratio: float | None = 0.0
    ) -> float:
        """Tokens a request to ``pool`` is expected to generate (0 while unknown), at most
        ``max_tokens`` when the request sets it. 0 too where the decode is not priced: while
        the pool's answers average fewer than ``min_ratio`` output tokens per prompt token, or
        for ``min_ratio`` None (a policy that does not price the decode)."""
        mean = self._known(pool)
        if mean is None or min_ratio is None or self._ratio(mean) < min_ratio:
            return 0.0
        if max_tokens is not None and max_tokens < mean.tokens:
            return float(max_tokens)
        return mean.tokens

    def output_ratio(self, pool: str) -> float:
        """The pool's mean output tokens per prompt token (0 while unknown)."""
        mean = self._known(pool)
        return 0.0 if mean is None else self._ratio(mean)

    def _known(self, pool: str) -> _PoolMean | None:
        mean = self._pools.get(pool)
        return None if mean is None or mean.answers < self.params.min_answers else mean

    @staticmethod
    def _ratio(mean: _PoolMean) -> float:
        return mean.tokens / max(mean.prompt_tokens, 1.0)

    def retain(self, pools: set[str]) -> None:
        """Forget the pools not in ``pools`` (a reload removed them)."""
        for pool in [p for p in self._pools if p not in pools]:
            del self._pools[pool]
