"""``round-robin`` picker: the candidate this router chose least recently (ties: by id)."""

from kvgate.scoring.plugins.round_robin.plugin import RoundRobinParams, RoundRobinPicker

__all__ = ["RoundRobinParams", "RoundRobinPicker"]
