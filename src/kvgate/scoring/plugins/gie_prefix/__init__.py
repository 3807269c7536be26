"""``gie-prefix-cache`` scorer (GIE re-implementation): share of the first 256 blocks held."""

from kvgate.scoring.plugins.gie_prefix.plugin import GiePrefixParams, GiePrefixScorer

__all__ = ["GiePrefixParams", "GiePrefixScorer"]
