"""``kv-cache-usage`` scorer (balance): 1 - the engine's KV cache usage (vllm:kv_cache_usage_perc)."""

from kvgate.scoring.plugins.kv_cache_usage.plugin import KvCacheUsageParams, KvCacheUsageScorer

__all__ = ["KvCacheUsageParams", "KvCacheUsageScorer"]
