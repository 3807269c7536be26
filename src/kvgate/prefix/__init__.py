"""Prompt → tokens → vLLM-exact chained block hashes."""
