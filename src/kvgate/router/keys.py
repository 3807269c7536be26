"""Request body → prompt tokens → block keys, for one pool's engine settings.

Exact mode (the pool has a tokenizer, or the request carries token ids): the prompt's token ids
are hashed with `kvgate.prefix.BlockHasher` exactly as the pool's vLLM engines hash them
(algorithm, block size, seed, int-hash form, and the request's `cache_salt` on block 0), so the
keys equal the ones the engines publish in KV events.

Approximate mode (no tokenizer): the prompt text (chat messages rendered as `role\\ncontent`
records) is cut into blocks of `approximate_chars_per_block` characters and chain-hashed with
BLAKE2b, salted the same way. Such keys only predict hits between requests routed by kvgate
(routing history); the token count is estimated at 4 characters per token.

A `Keyer` is shared by every pool with the same settings; its hasher caches chains, so the
earlier turns of an agent session are not hashed again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.api.router_config import EngineConfig
from kvgate.prefix.hashing import BlockHasher
from kvgate.router.errors import RouterError

CHARS_PER_TOKEN_ESTIMATE = 4

#: Renders a chat request's messages (and tools) into prompt token ids; None = cannot.
ChatTokenizer = Callable[[Mapping[str, Any]], list[int]]
#: Tokenizes a completion prompt string.
TextTokenizer = Callable[[str], list[int]]


@dataclass(frozen=True, slots=True)
class RequestKeys:
    prompt_tokens: int
    block_keys: list[bytes]
    block_tokens: int  # tokens per block (estimated for approximate keys)
    exact: bool
    token_ids: list[int] | None = None  # exact mode only


def keyer_identity(engine: EngineConfig) -> tuple[Any, ...]:
    """Pools whose engines agree on this tuple share block keys for the same request."""
    tok = engine.tokenizer
    return (
        engine.block_size,
        engine.hash_algo,
        engine.hash_seed,
        engine.int_block_hashes,
        tok.path,
        tok.chat_template,
        tok.approximate_chars_per_block,
    )


class Keyer:
    def __init__(
        self,
        engine: EngineConfig,
        *,
        chat_tokenizer: ChatTokenizer | None = None,
        text_tokenizer: TextTokenizer | None = None,
    ) -> None:
        self.engine = engine
        self.hasher = BlockHasher(engine.hash_algo, engine.block_size, engine.hash_seed)
        self._chat = chat_tokenizer
        self._text = text_tokenizer
        self._chars = engine.tokenizer.approximate_chars_per_block

    @property
    def exact_capable(self) -> bool:
        return self._chat is not None

    def keys(self, body: Mapping[str, Any], kind: str, cache_salt: str | None) -> RequestKeys:
        """`kind` is "chat" or "completion". Raises RouterError on a malformed prompt."""
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RouterError(400, "`messages` must be a non-empty list", param="messages")
            if self._chat is not None:
                try:
                    tokens = self._chat(body)
                except (ValueError, TypeError, KeyError) as exc:
                    raise RouterError(
                        400, f"cannot render messages: {exc}", param="messages"
                    ) from exc
                return self._exact(tokens, cache_salt)
            return self._approximate(_chat_text(messages, body.get("tools")), cache_salt)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if self._text is not None:
                return self._exact(self._text(prompt), cache_salt)
            return self._approximate(prompt, cache_salt)
        if isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt):
            return self._exact(prompt, cache_salt)
        if isinstance(prompt, list) and prompt:
            # A batch of prompts: route on the first one's prefix, approximately.
            return self._approximate(json.dumps(prompt[0]), cache_salt)
        raise RouterError(400, "`prompt` must be a string or a list of token ids", param="prompt")

    def _exact(self, tokens: Sequence[int], cache_salt: str | None) -> RequestKeys:
        token_list = list(tokens)
        keys = self.hasher.block_keys(
            token_list, cache_salt=cache_salt, int_form=self.engine.int_block_hashes
        )
        return RequestKeys(len(token_list), keys, self.engine.block_size, True, token_list)

    def _approximate(self, text: str, cache_salt: str | None) -> RequestKeys:
        size = self._chars
        parent = hashlib.blake2b((cache_salt or "").encode(), digest_size=16).digest()
        keys: list[bytes] = []
        for start in range(0, len(text) - size + 1, size):
            parent = hashlib.blake2b(
                text[start : start + size].encode(), digest_size=16, key=parent
            ).digest()
            keys.append(parent)
        tokens = max(1, len(text) // CHARS_PER_TOKEN_ESTIMATE)
        block_tokens = max(1, size // CHARS_PER_TOKEN_ESTIMATE)
        return RequestKeys(tokens, keys, block_tokens, False, None)


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _chat_text(messages: list[Any], tools: object) -> str:
    parts: list[str] = []
    if tools is not None:
        parts.append("tools\n" + json.dumps(tools, sort_keys=True))
    for message in messages:
        if not isinstance(message, dict):
            raise RouterError(400, "each message must be an object", param="messages")
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True)
        extra = message.get("tool_calls")
        parts.append(f"{message.get('role')}\n{content}" + (json.dumps(extra) if extra else ""))
    return "\x1e".join(parts) + "\x1e"
