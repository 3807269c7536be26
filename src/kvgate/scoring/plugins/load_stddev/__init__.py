"""``load-stddev`` guard (AIBrix re-implementation): no pod above mean + k x stddev load."""

from kvgate.scoring.plugins.load_stddev.plugin import LoadStddevFilter, LoadStddevParams

__all__ = ["LoadStddevFilter", "LoadStddevParams"]
