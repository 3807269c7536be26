"""Text ↔ token ids for the simulated server.

With ``--tokenizer`` (a directory holding ``tokenizer.json`` and optionally
``tokenizer_config.json`` with a ``chat_template``) the simulator tokenizes exactly as vLLM would,
through :mod:`kvgate.prefix`. Without one (no model files on a laptop) it uses
:class:`ChunkCodec`: every 4 characters of text are one token whose id is a CRC-32 of the chunk,
which gives realistic token counts (about 4 characters per token, like BPE tokenizers on English)
and identical ids for identical text; chat messages are rendered with a fixed template.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Protocol

CHUNK_CHARS = 4
_FIRST_ID = 100

# Words the fallback codec prints for generated token ids (the text of a simulated answer).
_WORDS = (
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it", " as", " with",
    " was", " on", " be", " by", " this", " are", " from", " at", " or", " an", " cache",
    " token", " prefix", " block", " router", " pod", " model", " request", " latency", " fast",
)  # fmt: skip


class TextCodec(Protocol):
    """What the server needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class ChunkCodec:
    """Deterministic stand-in tokenizer used when no tokenizer files are given."""

    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        span = self.vocab_size - _FIRST_ID
        return [
            _FIRST_ID + zlib.crc32(text[i : i + CHUNK_CHARS].encode()) % span
            for i in range(0, len(text), CHUNK_CHARS)
        ]

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        parts = [
            f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n" for m in messages
        ]
        return self.encode("".join(parts) + "<|assistant|>\n")

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(_WORDS[t % len(_WORDS)] for t in token_ids)


def _content_text(content: Any) -> str:
    """OpenAI message content: a string or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise TypeError("message content must be a string or a list of content parts")
