"""``predicted-ttft`` scorer (hybrid): the cost model's predicted time to first token."""

from kvgate.scoring.plugins.predicted_ttft.plugin import PredictedTtftParams, PredictedTtftScorer

__all__ = ["PredictedTtftParams", "PredictedTtftScorer"]
