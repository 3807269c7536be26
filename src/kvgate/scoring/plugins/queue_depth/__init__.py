"""``queue-depth`` scorer (balance): fewer requests on the pod is better."""

from kvgate.scoring.plugins.queue_depth.plugin import QueueDepthParams, QueueDepthScorer

__all__ = ["QueueDepthParams", "QueueDepthScorer"]
