"""``load-imbalance`` guard (AIBrix re-implementation): least-loaded pods only when skewed."""

from kvgate.scoring.plugins.load_imbalance.plugin import LoadImbalanceFilter, LoadImbalanceParams

__all__ = ["LoadImbalanceFilter", "LoadImbalanceParams"]
