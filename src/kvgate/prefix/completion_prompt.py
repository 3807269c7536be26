"""How vLLM 0.33 reads the `prompt` of a `/v1/completions` body: the one rule kvgate applies.

The router (keys), the request tokenizer and the simulator all call `completion_prompts`, so
they agree with each other and with vLLM on every edge case. vLLM's rule, in three steps:

1. **Type** (``CompletionRequest.prompt`` in ``vllm/entrypoints/openai/completion/protocol.py``):
   pydantic validates it as ``list[int ≥ 0] | list[list[int ≥ 0]] | str | list[str]`` in smart
   mode: a member that matches strictly wins, else the first that matches after lax coercion.
   So ``[true, false]`` is the token ids ``[1, 0]``, ``[1.0, 2]`` is ``[1, 2]``, ``[1, "2"]`` is
   ``[1, 2]`` but ``["1", "2"]`` is two text prompts; ``[-1]``, ``[1.5]``, ``[null]``,
   ``["a", 1]`` and a mix of strings and lists are invalid. ``None`` and ``""`` are refused
   ("Either prompt or prompt_embeds must be provided and non-empty"; kvgate takes no embeds).
2. **Batch** (``prompt_to_seq``, ``vllm/renderers/inputs/preprocess.py``): a string, or a
   non-empty list of ints, is one prompt; any other list is a batch, one prompt per item
   (``[[1, 2]]`` is a batch of one, ``[]`` a batch of none).
3. **Tokens** (``validate_token_ids``, ``vllm/renderers/base.py``, and the input processor):
   a token prompt must not be empty ("The decoder prompt cannot be empty") and every id must
   be in the vocabulary ("Token id N is out of vocabulary"). Without a vocabulary size the
   bound is 2⁶³ (engines hold ids as int64: no vocabulary is larger).

Text prompts are returned as they are, for the caller's tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

#: Token ids at or above this are out of every vocabulary.
MAX_TOKEN_ID_BOUND = 1 << 63

_TokenId = Annotated[int, Field(ge=0)]
#: vLLM 0.33's annotation of ``CompletionRequest.prompt`` (None handled separately).
_PROMPT = TypeAdapter(list[_TokenId] | list[list[_TokenId]] | str | list[str])

TokenIds = list[int]


class PromptError(ValueError):
    """The request body cannot be turned into token ids."""


def completion_prompts(prompt: Any, *, vocab_size: int | None = None) -> list[str | TokenIds]:
    """The prompts of a completion request, as vLLM reads `prompt`: each a text or token ids.

    Raises `PromptError` where vLLM answers 400. `vocab_size`: ids must be below it (the
    engine's vocabulary, where known).
    """
    if prompt is None or prompt == "":
        raise PromptError("Either prompt or prompt_embeds must be provided and non-empty.")
    value: Any = prompt
    # Non-negative exact ints, the common case, checked in C: pydantic's strict list[int] match.
    exact_ids = type(prompt) is list and set(map(type, prompt)) <= {int}
    if not exact_ids or (prompt and min(prompt) < 0):
        try:
            value = _PROMPT.validate_python(prompt)
        except ValidationError:
            raise PromptError(
                "prompt must be a string, a list of token ids, or a batch of them "
                "(strings, or lists of non-negative integer token ids)"
            ) from None
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        prompts: list[str | TokenIds] = [value]
    else:
        prompts = list(value)
    bound = MAX_TOKEN_ID_BOUND if vocab_size is None else vocab_size
    for item in prompts:
        if isinstance(item, list):
            if not item:
                raise PromptError("The decoder prompt cannot be empty")
            if (largest := max(item)) >= bound:
                raise PromptError(f"Token id {largest} is out of vocabulary")
    return prompts
