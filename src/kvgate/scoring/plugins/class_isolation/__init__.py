"""``class-isolation`` filter: online requests leave the pods that batch work borrowed"""

from kvgate.scoring.plugins.class_isolation.plugin import ClassIsolationFilter, ClassIsolationParams

__all__ = ["ClassIsolationFilter", "ClassIsolationParams"]
