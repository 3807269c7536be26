"""The cache directory: which pod holds which prefix blocks, fed by vLLM KV events."""
