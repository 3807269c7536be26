"""``kv-block-cost`` scorer (Dynamo re-implementation): prefill blocks + decode blocks."""

from kvgate.scoring.plugins.kv_block_cost.plugin import KvBlockCostParams, KvBlockCostScorer

__all__ = ["KvBlockCostParams", "KvBlockCostScorer"]
