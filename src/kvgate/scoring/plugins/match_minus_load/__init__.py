"""``match-minus-load`` scorer (production-stack re-implementation): match - beta x load."""

from kvgate.scoring.plugins.match_minus_load.plugin import (
    MatchMinusLoadParams,
    MatchMinusLoadScorer,
)

__all__ = ["MatchMinusLoadParams", "MatchMinusLoadScorer"]
