"""Prompt → tokens → vLLM-exact chained block hashes.

Public names are listed here once; the modules behind them are implementation detail.

Block hashing, prompt rules and prefix diffs need only kvgate's base dependencies (`kvgate hash`
runs from a bare `pip install kvgate`). Tokenizers and chat templates need `tokenizers` and
`jinja2` (the `router` and `sim` extras): their names are imported on first use (PEP 562).
"""

from typing import TYPE_CHECKING

from kvgate._lazy import lazy_names
from kvgate.prefix.approx import ApproxBlockHasher, request_text
from kvgate.prefix.completion_prompt import PromptError, completion_prompts
from kvgate.prefix.diff import (
    FIELD_NAMES,
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

if TYPE_CHECKING:
    from kvgate.prefix.chat import ChatTemplate, ChatTemplateError, normalize_messages
    from kvgate.prefix.prompt import RequestTokenizer
    from kvgate.prefix.tokenizer import PromptTooLong, Tokenizer, TokenizerError

#: Names whose modules import `tokenizers` or `jinja2`: loaded when first asked for.
_LAZY = {
    "ChatTemplate": "kvgate.prefix.chat",
    "ChatTemplateError": "kvgate.prefix.chat",
    "normalize_messages": "kvgate.prefix.chat",
    "PromptTooLong": "kvgate.prefix.tokenizer",
    "RequestTokenizer": "kvgate.prefix.prompt",
    "Tokenizer": "kvgate.prefix.tokenizer",
    "TokenizerError": "kvgate.prefix.tokenizer",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "DEFAULT_SEED",
    "FIELD_NAMES",
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
    "completion_prompts",
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
