"""Online estimate of how many tokens a pool's answers run to.

The cost model prices the decode a request will do on each pod (``decode_seconds``): its
expected output tokens x the time each decode step there spends reading the KV cache of the
requests already running. The router cannot know one request's output length in advance; it
learns each pool's mean from the ``usage.completion_tokens`` of the answers it relays (an
exponentially weighted mean, ``alpha`` per answer), capped by the request's own ``max_tokens``
when it sets one. Until a pool has ``min_answers`` answers the expectation is 0: no decode
price. Memory: one float and one count per pool (pools come from the router's configuration).
No clock reads, no I/O: the router owns one instance and feeds it.
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
    answers: int


class OutputLengthEstimator:
    """Per-pool EWMA of completion tokens. Not thread-safe; one per router process."""

    __slots__ = ("_pools", "params")

    def __init__(self, params: OutputLengthParams | None = None) -> None:
        self.params = params or OutputLengthParams()
        self._pools: dict[str, _PoolMean] = {}

    def observe(self, pool: str, completion_tokens: int) -> None:
        """Record one whole answer of ``completion_tokens`` tokens from ``pool``."""
        if completion_tokens < 0:
            return
        mean = self._pools.get(pool)
        if mean is None:
            self._pools[pool] = _PoolMean(float(completion_tokens), 1)
            return
        mean.tokens += self.params.alpha * (completion_tokens - mean.tokens)
        mean.answers += 1

    def expected(self, pool: str, max_tokens: int | None = None) -> float:
        """Tokens a request to ``pool`` is expected to generate (0 while unknown), at most
        ``max_tokens`` when the request sets it."""
        mean = self._pools.get(pool)
        if mean is None or mean.answers < self.params.min_answers:
            return 0.0
        if max_tokens is not None and max_tokens < mean.tokens:
            return float(max_tokens)
        return mean.tokens

    def retain(self, pools: set[str]) -> None:
        """Forget the pools not in ``pools`` (a reload removed them)."""
        for pool in [p for p in self._pools if p not in pools]:
            del self._pools[pool]
