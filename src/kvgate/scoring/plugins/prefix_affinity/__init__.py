"""``prefix-cache-affinity`` filter (llm-d re-implementation): keep a request on its holders."""

from kvgate.scoring.plugins.prefix_affinity.plugin import (
    PrefixAffinityFilter,
    PrefixAffinityParams,
)

__all__ = ["PrefixAffinityFilter", "PrefixAffinityParams"]
