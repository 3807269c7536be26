"""``priced-affinity`` filter: stay on the prompt's holders while waiting costs less than a
multiple of recomputing it."""

from kvgate.scoring.plugins.priced_affinity.plugin import (
    PricedAffinityFilter,
    PricedAffinityParams,
)

__all__ = ["PricedAffinityFilter", "PricedAffinityParams"]
