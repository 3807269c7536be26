"""Prompt → tokens → vLLM-exact chained block hashes.

Public names are listed here once; the modules behind them are implementation detail.
"""

from kvgate.prefix.approx import ApproxBlockHasher, request_text
from kvgate.prefix.chat import ChatTemplate, ChatTemplateError, normalize_messages
from kvgate.prefix.diff import (
    FieldDifference,
    PrefixDiff,
    common_prefix_length,
    diff_requests,
    first_difference,
)
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
    max_cacheable_blocks,
    none_hash,
)
from kvgate.prefix.prompt import PromptError, RequestTokenizer
from kvgate.prefix.tokenizer import PromptTooLong, Tokenizer, TokenizerError

__all__ = [
    "DEFAULT_SEED",
    "HASH_ALGOS",
    "ApproxBlockHasher",
    "BlockHasher",
    "BlockKey",
    "ChainCache",
    "ChatTemplate",
    "ChatTemplateError",
    "FieldDifference",
    "HashAlgo",
    "LoraKey",
    "PrefixDiff",
    "PromptError",
    "PromptTooLong",
    "RequestTokenizer",
    "Tokenizer",
    "TokenizerError",
    "block_key",
    "common_prefix_length",
    "diff_requests",
    "extra_keys_for_block",
    "first_difference",
    "hash_block",
    "hash_object",
    "int_block_key",
    "int_form",
    "max_cacheable_blocks",
    "none_hash",
    "normalize_messages",
    "request_text",
]
