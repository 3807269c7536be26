"""vLLM's embeddings and tokenizer endpoints (`POST /v1/embeddings`, `/tokenize`,
`/detokenize`), for the simulated pod.

An embeddings request's `input` (a string, a list of strings, token ids or lists of them) is one
prefill per item, each computed by the engine (so it is queued, cached and timed as any prompt);
each answer is a deterministic vector of `DIMENSIONS` floats derived from its tokens, and the
usage counts the items' prompt tokens, as vLLM's does (`prompt_tokens`, `total_tokens`).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from kvgate.sim.openai import BadRequest, json_object
from kvgate.sim.text import TextCodec

DIMENSIONS = 8


def embedding_inputs(raw: bytes, codec: TextCodec) -> tuple[str, list[list[int]]]:
    """The model named and each input's token ids; BadRequest for what vLLM refuses."""
    body = json_object(raw)
    items = body.get("input")
    if isinstance(items, str) or (isinstance(items, list) and items and isinstance(items[0], int)):
        items = [items]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a non-empty string, list of strings or token ids")
    try:  # each input read as a completion's prompt (a text, or checked token ids)
        prompts = [codec.completion_token_ids({"prompt": item})[0] for item in items]
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc
    return str(body.get("model") or ""), prompts


def embedding(tokens: list[int]) -> list[float]:
    """A unit-free, deterministic vector for `tokens`."""
    digest = hashlib.blake2b(struct.pack(f"<{len(tokens)}i", *tokens), digest_size=4 * DIMENSIONS)
    return [round(v / 2**32, 6) for v in struct.unpack(f"<{DIMENSIONS}I", digest.digest())]


def embeddings_body(model: str, prompts: list[list[int]], created: int) -> dict[str, Any]:
    count = sum(len(p) for p in prompts)
    return {
        "id": f"embd-{created}",
        "object": "list",
        "created": created,
        "model": model,
        "data": [
            {"index": i, "object": "embedding", "embedding": embedding(p)}
            for i, p in enumerate(prompts)
        ],
        "usage": {"prompt_tokens": count, "total_tokens": count, "completion_tokens": 0},
    }


def tokenize(raw: bytes, codec: TextCodec, max_model_len: int) -> dict[str, Any]:
    """`/tokenize`: a `prompt` (or chat `messages`) as token ids."""
    body = json_object(raw)
    if isinstance(body.get("messages"), list):
        tokens = codec.chat_token_ids(body)
    elif isinstance(body.get("prompt"), str):
        tokens = codec.completion_token_ids({"prompt": body["prompt"]})[0]
    else:
        raise BadRequest("'prompt' must be a string (or give 'messages')")
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens}


def detokenize(raw: bytes, codec: TextCodec) -> dict[str, Any]:
    body = json_object(raw)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise BadRequest("'tokens' must be a list of token ids")
    return {"prompt": codec.decode(tokens)}
