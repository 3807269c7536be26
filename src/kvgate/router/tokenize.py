"""Load a pool's tokenizer and chat template (kvgate.prefix) as the two callables keys.py uses.

No tokenizer configured → `(None, None)`: the pool is keyed approximately.
"""

from __future__ import annotations

from kvgate.api.router_config import TokenizerConfig
from kvgate.router.keys import ChatTokenizer, TextTokenizer


def load_tokenizers(config: TokenizerConfig) -> tuple[ChatTokenizer | None, TextTokenizer | None]:
    if config.path is None:
        return None, None
    raise ValueError("exact tokenization needs kvgate.prefix's tokenizer, not available yet")
