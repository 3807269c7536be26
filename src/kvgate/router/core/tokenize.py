"""Load a pool's tokenizer and chat template (`kvgate.prefix`); None = approximate keys."""

from __future__ import annotations

from pathlib import Path

from kvgate.api.router_config import TokenizerConfig
from kvgate.prefix import RequestTokenizer, Tokenizer, TokenizerError


def load_request_tokenizer(config: TokenizerConfig) -> RequestTokenizer | None:
    """Raises ValueError when the configured tokenizer or template cannot be loaded."""
    if config.path is None:
        return None
    try:
        tokenizer = Tokenizer.from_dir(config.path, segment_cache_bytes=config.segment_cache_bytes)
        template = (
            Path(config.chat_template).read_text(encoding="utf-8") if config.chat_template else None
        )
        return RequestTokenizer(
            tokenizer,
            template,
            default_chat_template_kwargs=config.default_chat_template_kwargs,
            reasoning_effort_map=config.reasoning_effort_map,
        )
    except (TokenizerError, OSError) as exc:
        raise ValueError(f"tokenizer {config.path}: {exc}") from exc
