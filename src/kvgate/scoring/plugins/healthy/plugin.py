"""``healthy`` filter (hard): drops endpoints that are unhealthy or draining."""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import NoParams


class HealthyParams(NoParams):
    """No parameters."""


class HealthyFilter:
    name = "healthy"
    reason: str | None = None

    def __init__(self, params: HealthyParams | None = None) -> None:
        self.params = params or HealthyParams()

    def filter(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot]
    ) -> Sequence[EndpointSnapshot]:
        return [e for e in candidates if e.healthy and not e.draining]
