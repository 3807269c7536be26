"""``round-robin`` picker: the candidate this router chose least recently (ties: by id).

Round robin expressed over the caller's :class:`~kvgate.scoring.base.ChoiceHistory` rather than a
counter, so it stays fair when endpoints join, leave or are filtered out. Ignores scores.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import NoParams


class RoundRobinParams(NoParams):
    """No parameters."""


class RoundRobinPicker:
    name = "round-robin"

    def __init__(self, params: RoundRobinParams | None = None) -> None:
        self.params = params or RoundRobinParams()

    def pick(
        self, state: CycleState, candidates: Sequence[EndpointSnapshot], totals: Sequence[float]
    ) -> EndpointSnapshot:
        last = state.history.last_chosen
        return min(candidates, key=lambda e: (last(e.id), e.id))
