"""``load-bound`` guard: no endpoint above ``factor`` x the mean load (bounded-load hashing)."""

from kvgate.scoring.plugins.load_bound.plugin import LoadBoundFilter, LoadBoundParams

__all__ = ["LoadBoundFilter", "LoadBoundParams"]
