"""``prefix-cache`` scorer (affinity): the share of the prompt the pod holds in its prefix cache."""

from kvgate.scoring.plugins.prefix_cache.plugin import PrefixCacheParams, PrefixCacheScorer

__all__ = ["PrefixCacheParams", "PrefixCacheScorer"]
