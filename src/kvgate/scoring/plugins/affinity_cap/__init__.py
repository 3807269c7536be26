"""``affinity-cap`` guard: never wait longer than ``max_affinity_wait_seconds`` in a pod's queue"""

from kvgate.scoring.plugins.affinity_cap.plugin import AffinityCapFilter, AffinityCapParams

__all__ = ["AffinityCapFilter", "AffinityCapParams"]
