"""``match-percent`` scorer (AIBrix re-implementation): whole percent of the prompt held."""

from kvgate.scoring.plugins.match_percent.plugin import MatchPercentParams, MatchPercentScorer

__all__ = ["MatchPercentParams", "MatchPercentScorer"]
