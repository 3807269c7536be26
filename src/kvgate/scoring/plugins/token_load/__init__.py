"""``token-load`` scorer (llm-d re-implementation): fewer queued prefill tokens is better."""

from kvgate.scoring.plugins.token_load.plugin import TokenLoadParams, TokenLoadScorer

__all__ = ["TokenLoadParams", "TokenLoadScorer"]
