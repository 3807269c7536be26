"""Request bodies → prompt token ids, and generated ids → text, for the simulated server.

With a tokenizer (``--tokenizer DIR``, or ``--model DIR`` holding ``tokenizer.json``) the
simulator tokenizes exactly as vLLM would, through :mod:`kvgate.prefix` (tokenizer and chat
template). Without one (no model files on a laptop) it uses :class:`ChunkCodec`: every 4
characters of text are one token whose id is a CRC-32 of the chunk, which gives realistic token
counts (about 4 characters per token, like BPE tokenizers on English) and identical ids for
identical text; chat messages are rendered with a fixed template.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kvgate.prefix import PromptError, RequestTokenizer, Tokenizer, completion_prompts

CHUNK_CHARS = 4
_FIRST_ID = 100

# Words the fallback codec prints for generated token ids (the text of a simulated answer).
_WORDS = (
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it", " as", " with",
    " was", " on", " be", " by", " this", " are", " from", " at", " or", " an", " cache",
    " token", " prefix", " block", " router", " pod", " model", " request", " latency", " fast",
)  # fmt: skip


class TextCodec(Protocol):
    """What the server needs from a tokenizer. Errors raise ``ValueError`` (a 400)."""

    vocab_size: int

    def completion_token_ids(self, body: Mapping[str, Any]) -> list[list[int]]:
        """One token-id list per prompt of a ``/v1/completions`` body."""
        ...

    def chat_token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a ``/v1/chat/completions`` body."""
        ...

    def message_ends(
        self, body: Mapping[str, Any], token_ids: Sequence[int], indices: Iterable[int]
    ) -> dict[int, int]:
        """Message index → the token offset where that message ends in ``token_ids``."""
        ...

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

    def completion_token_ids(self, body: Mapping[str, Any]) -> list[list[int]]:
        prompts = completion_prompts(body.get("prompt"), vocab_size=self.vocab_size)
        return [self.encode(p) if isinstance(p, str) else p for p in prompts]

    def chat_token_ids(self, body: Mapping[str, Any]) -> list[int]:
        return self.encode("".join(_chunk_parts(body.get("messages"))) + "<|assistant|>\n")

    def message_ends(
        self, body: Mapping[str, Any], token_ids: Sequence[int], indices: Iterable[int]
    ) -> dict[int, int]:
        """The chunks wholly inside the first i+1 rendered messages (a chunk can straddle two
        messages: it belongs to the later one)."""
        ends: list[int] = []
        total = 0
        for part in _chunk_parts(body["messages"]):
            total += len(part)
            ends.append(total // CHUNK_CHARS)
        return {i: ends[i] for i in indices}

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(_WORDS[t % len(_WORDS)] for t in token_ids)


class PrefixCodec:
    """A model's real tokenizer and chat template (``kvgate.prefix``)."""

    def __init__(self, directory: str | Path) -> None:
        self.tokenizer = Tokenizer.from_dir(directory)
        self.requests = RequestTokenizer(self.tokenizer)
        self.vocab_size = int(self.tokenizer.backend.get_vocab_size())

    def completion_token_ids(self, body: Mapping[str, Any]) -> list[list[int]]:
        return self.requests.completion_token_ids(body, vocab_size=self.vocab_size)

    def chat_token_ids(self, body: Mapping[str, Any]) -> list[int]:
        if self.requests.template is None:
            raise PromptError("the tokenizer has no chat template")
        return self.requests.chat_token_ids(body)

    def message_ends(
        self, body: Mapping[str, Any], token_ids: Sequence[int], indices: Iterable[int]
    ) -> dict[int, int]:
        return self.requests.message_ends(body, token_ids, indices)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)


def load_codec(tokenizer: str | None, model: str, vocab_size: int) -> TextCodec:
    """``--tokenizer`` if given, else ``--model`` when it is a model directory, else the stand-in."""
    if tokenizer:
        return PrefixCodec(tokenizer)
    if (Path(model) / "tokenizer.json").is_file():
        return PrefixCodec(model)
    return ChunkCodec(vocab_size)


def _chunk_parts(messages: Any) -> list[str]:
    """The fallback template's rendering of each message."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object with 'role' and 'content'")
        parts.append(f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n")
    return parts


def _content_text(content: Any) -> str:
    """OpenAI message content: a string or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise ValueError("message content must be a string or a list of content parts")
