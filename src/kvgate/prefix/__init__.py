"""Prompt → tokens → vLLM-exact chained block hashes.

Public names are listed here once; the modules behind them are implementation detail.
"""

from kvgate.prefix.hashing import (
    DEFAULT_SEED,
    HASH_ALGOS,
    BlockHasher,
    BlockKey,
    ChainCache,
    HashAlgo,
    LoraKey,
    block_key,
    extra_keys_for_block,
    hash_block,
    hash_object,
    int_block_key,
    int_form,
    none_hash,
)

__all__ = [
    "DEFAULT_SEED",
    "HASH_ALGOS",
    "BlockHasher",
    "BlockKey",
    "ChainCache",
    "HashAlgo",
    "LoraKey",
    "block_key",
    "extra_keys_for_block",
    "hash_block",
    "hash_object",
    "int_block_key",
    "int_form",
    "none_hash",
]
