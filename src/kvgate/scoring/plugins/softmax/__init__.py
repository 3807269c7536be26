"""``softmax`` picker (Dynamo re-implementation): temperature sampling over total scores."""

from kvgate.scoring.plugins.softmax.plugin import SoftmaxParams, SoftmaxPicker

__all__ = ["SoftmaxParams", "SoftmaxPicker"]
