"""``healthy`` filter (hard): drops endpoints that are unhealthy or draining."""

from kvgate.scoring.plugins.healthy.plugin import HealthyFilter, HealthyParams

__all__ = ["HealthyFilter", "HealthyParams"]
