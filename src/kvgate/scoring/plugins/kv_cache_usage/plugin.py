"""``kv-cache-usage`` scorer (balance): 1 - the engine's KV cache usage (vllm:kv_cache_usage_perc).

A pod with no fresh report (``EndpointSnapshot.engine`` is None: never scraped, or older than
the router's ``load_metrics.stale_after_seconds``) scores ``unknown_score``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class KvCacheUsageParams(StrictParams):
    unknown_score: float = Field(default=0.5, ge=0, le=1)


class KvCacheUsageScorer:
    name = "kv-cache-usage"

    def __init__(self, params: KvCacheUsageParams | None = None) -> None:
        self.params = params or KvCacheUsageParams()

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        out: list[float] = []
        for e in candidates:
            eng = e.engine
            if eng is None:
                out.append(self.params.unknown_score)
            else:
                out.append(min(1.0, max(0.0, 1.0 - eng.kv_cache_usage)))
        return out
