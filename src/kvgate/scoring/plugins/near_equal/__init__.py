"""``near-equal`` picker: best total score, with randomised choice among near-equal candidates."""

from kvgate.scoring.plugins.near_equal.plugin import NearEqualParams, NearEqualPicker

__all__ = ["NearEqualParams", "NearEqualPicker"]
