"""Pure routing decisions: filters, scorers and pickers over endpoint snapshots.

The contract is in :mod:`kvgate.scoring.base`; see docs/scoring.md.
"""

from kvgate.scoring.base import (
    CandidateExplanation,
    ChoiceHistory,
    CostEstimate,
    CycleState,
    Decision,
    EndpointSnapshot,
    EngineLoad,
    Explanation,
    Filter,
    MatchedBlocks,
    NoEligibleEndpointError,
    Picker,
    Policy,
    RoutingRequest,
    Scorer,
)

__all__ = [
    "CandidateExplanation",
    "ChoiceHistory",
    "CostEstimate",
    "CycleState",
    "Decision",
    "EndpointSnapshot",
    "EngineLoad",
    "Explanation",
    "Filter",
    "MatchedBlocks",
    "NoEligibleEndpointError",
    "Picker",
    "Policy",
    "RoutingRequest",
    "Scorer",
]
