"""``softmax`` picker: Dynamo's softmax sampling over the candidates' total scores.

A re-implementation of Dynamo's ``softmax_sample`` (ai-dynamo/dynamo, ``lib/llm/src/kv_router``
selector, read 2026). Dynamo samples worker *w* with probability proportional to
``exp(-v_w / T)``, where ``v_w`` is its cost min-max scaled to [0, 1]. Here the candidates' total
scores (higher is better) are scaled the same way, ``s = (t - t_min) / (t_max - t_min)`` (so
``s = 1 - v``), and *w* is drawn with probability proportional to ``exp(s_w / T)``:

- ``temperature`` 0 (Dynamo's default): the best candidate; ties at random (Dynamo first prefers
  the smaller radix tree, which the snapshot does not know);
- all totals equal: uniform;
- larger temperatures flatten the choice (less herding onto the cheapest worker).

The single uniform draw comes from the injected rng.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class SoftmaxParams(StrictParams):
    temperature: float = Field(default=0.0, ge=0)
    """Dynamo ``--router-temperature``: 0 = deterministic best, higher = more random."""


class SoftmaxPicker:
    name = "softmax"

    def __init__(self, params: SoftmaxParams | None = None) -> None:
        self.params = params or SoftmaxParams()

    def probabilities(self, totals: Sequence[float]) -> list[float]:
        """The sampling distribution over ``totals`` (temperature > 0)."""
        low, high = min(totals), max(totals)
        if high == low:
            return [1.0 / len(totals)] * len(totals)
        span = high - low
        temperature = self.params.temperature
        # exp((s - 1) / T) keeps every exponent <= 0: no overflow at small temperatures
        weights = [math.exp(((t - low) / span - 1.0) / temperature) for t in totals]
        total = sum(weights)
        return [w / total for w in weights]

    def pick(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot], totals: Sequence[float]
    ) -> EndpointSnapshot:
        if len(candidates) == 1:
            return candidates[0]
        if self.params.temperature == 0:
            best = max(totals)
            top = [e for e, t in zip(candidates, totals, strict=True) if t == best]
            return top[0] if len(top) == 1 else top[state.rng.randrange(len(top))]
        sample = state.rng.random()
        cumulative = 0.0
        for e, p in zip(candidates, self.probabilities(totals), strict=True):
            cumulative += p
            if sample <= cumulative:
                return e
        return candidates[-1]
