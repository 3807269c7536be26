"""``holder-load`` guard: a prefix holder far above the least-loaded pod takes no more of it."""

from kvgate.scoring.plugins.holder_load.plugin import HolderLoadFilter, HolderLoadParams

__all__ = ["HolderLoadFilter", "HolderLoadParams"]
