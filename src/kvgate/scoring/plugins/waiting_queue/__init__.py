"""``waiting-queue`` scorer (GIE re-implementation): engine waiting requests, min-max scaled."""

from kvgate.scoring.plugins.waiting_queue.plugin import WaitingQueueParams, WaitingQueueScorer

__all__ = ["WaitingQueueParams", "WaitingQueueScorer"]
