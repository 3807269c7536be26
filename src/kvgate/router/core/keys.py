"""Request body → prompt tokens → block keys, for one pool's engine settings.

Exact mode (the pool has a tokenizer, or the request carries token ids): the prompt's token ids
(`kvgate.prefix.RequestTokenizer`: chat template + tokenizer, exactly as vLLM renders them) are
hashed with `kvgate.prefix.BlockHasher` as the pool's engines hash them (algorithm, block size,
seed, int-hash form, and the request's `cache_salt` on block 0), so the keys equal the ones the
engines publish in KV events.

Approximate mode (no tokenizer): `kvgate.prefix.ApproxBlockHasher` cuts the request's text into
fixed-size character blocks, chained and salted the same way. Such keys predict hits only
between requests routed by kvgate (routing history); tokens are estimated at 4 characters each.
Responses API bodies (`/v1/responses`) and Anthropic Messages API bodies (`/v1/messages`) are
always keyed so: the engine converts them to chat messages its own way, which the router does
not reproduce; so are pooling requests (`/v1/embeddings`, ...), by their `input`.

A `Keyer` is shared by every pool with the same settings; its hasher and tokenizer cache what
they have seen, and for chat prompts `reuse.PromptReuse` takes the ids and digests of a recent
prompt's common prefix as they are, so the earlier turns of an agent session are not tokenized
or hashed again. Every cache is bounded in bytes (`TokenizerConfig.*_bytes`) and safe for
concurrent use, so `keying.py` may run a large prompt in a worker thread while small ones are
keyed on the event loop.

Length: with the engines' `max_model_len`, a prompt with more tokens is refused with vLLM's 400
(`context_length_exceeded`) as soon as that is certain: token-id prompts by their length, text
by a bound from its length in characters, then while tokenizing (`Tokenizer.encode`), so a
prompt far over the limit is never tokenized whole. Only the first prompt of a completion batch
is keyed (the router routes on it). Approximate keys cover at most `approximate_max_blocks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api.router_config import EngineConfig
from kvgate.prefix import (
    ApproxBlockHasher,
    BlockHasher,
    LoraKey,
    PromptError,
    PromptTooLong,
    RequestTokenizer,
    completion_prompts,
    request_text,
)
from kvgate.prefix.approx import CHARS_PER_TOKEN, completion_text, responses_text
from kvgate.prefix.cache_ops import (
    CacheOps,
    CacheOpsError,
    LookupPlan,
    OpHistory,
    history_block_keys,
    lookup_plan,
    parse_cache_ops,
    token_prompt_history,
)
from kvgate.prefix.hashing import INT_KEY_SIZE
from kvgate.prefix.message_ends import render_budget
from kvgate.prefix.prompt import truncation
from kvgate.router.core.errors import RouterError
from kvgate.router.core.reuse import PromptReuse


@dataclass(frozen=True, slots=True)
class RequestKeys:
    prompt_tokens: int
    block_keys: list[bytes]
    block_tokens: int  # tokens per block (estimated for approximate keys)
    exact: bool
    token_ids: list[int] | None = None  # exact mode only
    # Requests with drops: the blocks the final state needs (a second directory lookup).
    lookup: LookupPlan | None = None
    # Approximate mode, a completion's text prompt: the text its keys cut into blocks of
    # `block_chars` characters (a copy of a prefix is sent as that text's prefix).
    prompt_text: str | None = None
    block_chars: int = 0

    @property
    def copyable(self) -> bool:
        """Whether a prefix of this prompt can be sent on its own (`prefix_copies.py`): its
        token ids, or in approximate mode its text (a completion's)."""
        if self.lookup is not None:
            return False
        return self.token_ids is not None if self.exact else self.prompt_text is not None

    @property
    def lookup_keys(self) -> list[bytes]:
        """What the routing history records: the blocks the pod keeps."""
        return self.block_keys if self.lookup is None else self.lookup.keys


def keyer_identity(engine: EngineConfig) -> tuple[Any, ...]:
    """Pools whose engines agree on this tuple share block keys for the same request."""
    return (
        engine.block_size,
        engine.hash_algo,
        engine.hash_seed,
        engine.int_block_hashes,
        engine.max_model_len,
        engine.tokenizer.model_dump_json(),  # path, template, template defaults, budgets
        engine.cache_ops,
    )


def _plain_chat(body: Mapping[str, Any]) -> bool:
    """Chat ids are the template's text tokenized with nothing added and nothing cut."""
    return (
        body.get("add_special_tokens", False) is False
        and body.get("truncate_prompt_tokens") is None
    )


def too_long(exc: PromptTooLong, param: str, model_limit: int | None) -> RouterError:
    """vLLM's answer to a prompt over `max_model_len`, in the OpenAI error shape (or the
    router's own, when its `keying.max_prompt_tokens` is the lower limit)."""
    count = f"{exc.at_least}" if exc.exact else f"at least {exc.at_least}"
    if model_limit is None or exc.limit < model_limit:
        return RouterError(
            400,
            f"This router accepts prompts of at most {exc.limit} tokens. However, your "
            f"request has {count} input tokens. Please reduce the length of the input messages.",
            code="prompt_too_long",
            param=param,
        )
    return RouterError(
        400,
        f"This model's maximum context length is {exc.limit} tokens. However, your request "
        f"has {count} input tokens. Please reduce the length of the input messages.",
        code="context_length_exceeded",
        param=param,
    )


class Keyer:
    """Block keys of request bodies for one hashing identity; safe for concurrent use."""

    def __init__(self, engine: EngineConfig, requests: RequestTokenizer | None = None) -> None:
        self.engine = engine
        self.requests = requests
        self.max_tokens = engine.max_model_len
        tok = engine.tokenizer
        self.hasher = BlockHasher(
            engine.hash_algo, engine.block_size, engine.hash_seed, cache_bytes=tok.hash_cache_bytes
        )
        self.approx = ApproxBlockHasher(
            tok.approximate_chars_per_block, max_blocks=tok.approximate_max_blocks
        )
        self.reuse = (
            PromptReuse(requests.tokenizer, self.hasher, max_bytes=tok.reuse_cache_bytes)
            if requests is not None and requests.tokenizer.segmented
            else None
        )

    def keys(
        self,
        body: Mapping[str, Any],
        kind: str,
        cache_salt: str | None,
        lora: LoraKey | None = None,
        session: str | None = None,
        *,
        max_prompt_tokens: int | None = None,
    ) -> RequestKeys:
        """`kind` is "chat", "completion", "responses", "messages" or "pooling"; `lora`: the
        adapter the request names (vLLM adds its key to every block); `session`: where to look
        for an earlier turn to reuse (never changes the keys); `max_prompt_tokens`: the
        router's own limit, on top of the pool's `max_model_len`. Raises RouterError (400) on a
        malformed or too long prompt."""
        if kind in ("responses", "messages"):
            return self._converted(body, kind, _approximate_salt(cache_salt, lora))
        if kind == "pooling":  # an embedding's `input` keyed as text (none: load only)
            return self._approximate(body, _approximate_salt(cache_salt, lora), kind)
        limits = [n for n in (self.max_tokens, max_prompt_tokens) if n is not None]
        limit = min(limits) if limits else None
        with_ops = body.get("cache") is not None and self.engine.cache_ops
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RouterError(400, "`messages` must be a non-empty list", param="messages")
            if not all(isinstance(m, dict) for m in messages):
                raise RouterError(400, "each message must be an object", param="messages")
            ops = _chat_ops(body, len(messages))
            if ops is not None and with_ops:
                return self._chat_with_ops(body, ops, cache_salt, lora, max_prompt_tokens)
        else:
            try:  # vLLM's reading of `prompt`; a batch is routed by its first prompt
                prompts = completion_prompts(body.get("prompt"))
            except PromptError as exc:
                raise RouterError(400, str(exc), param="prompt") from exc
            if not prompts:
                raise RouterError(400, "`prompt` is an empty batch", param="prompt")
            first = prompts[0]
            if isinstance(first, list) and self.requests is None:
                cut = truncation(body, self.max_tokens, chat=False)  # the engines cut ids too
                first = cut.ids(first) if cut is not None else first
                if limit is not None and len(first) > limit and not with_ops:
                    over = PromptTooLong(limit, len(first), exact=True)
                    raise too_long(over, "prompt", self.max_tokens)
                if with_ops:
                    return self._tokens_with_ops(first, body, cache_salt, lora, max_prompt_tokens)
                return self._exact(first, cache_salt, lora)
        if self.requests is None:
            return self._approximate(body, _approximate_salt(cache_salt, lora))
        param = "messages" if kind == "chat" else "prompt"
        try:
            if kind == "chat" and self.reuse is not None and _plain_chat(body):
                text = self.requests.chat_text(body)
                ids_t, digests = self.reuse.ids_and_digests(
                    text, cache_salt=cache_salt, lora=lora, session=session, max_tokens=limit
                )
                return self._from_digests(list(ids_t), digests)
            if kind == "chat":
                ids = self.requests.chat_token_ids(body, max_tokens=limit)
            else:
                cap = max_prompt_tokens if with_ops else limit
                ids = self.requests.completion_token_ids(body, max_tokens=cap, max_prompts=1)[0]
        except PromptTooLong as exc:
            raise too_long(exc, param, self.max_tokens) from None
        except (PromptError, ValueError, TypeError) as exc:
            raise RouterError(400, f"cannot tokenize the prompt: {exc}", param=param) from exc
        if kind != "chat" and with_ops:
            return self._tokens_with_ops(ids, body, cache_salt, lora, max_prompt_tokens)
        return self._exact(ids, cache_salt, lora)

    def _chat_with_ops(
        self,
        body: Mapping[str, Any],
        ops: CacheOps,
        cache_salt: str | None,
        lora: LoraKey | None,
        max_prompt_tokens: int | None,
    ) -> RequestKeys:
        """A chat prompt with ops: its ids, each named message's end, then branched keys.
        Without a tokenizer, or when the ends are more than one request may render
        (`render_budget`): keys of the messages up to the first op only (the part every branch
        shares; approximate without a tokenizer)."""
        if self.requests is None:
            head = {**body, "messages": body["messages"][: ops.boundaries[0] + 1]}
            approx = self._approximate(head, _approximate_salt(cache_salt, lora))
            tokens = max(1, int(len(request_text(body, self.approx.max_chars)) / CHARS_PER_TOKEN))
            return RequestKeys(tokens, approx.block_keys, approx.block_tokens, False)
        needed = ops.needed_ends()
        budget = render_budget(len(body["messages"]))
        try:
            ids = self.requests.chat_token_ids(body, max_tokens=max_prompt_tokens)
            ends = self.requests.message_ends(body, ids, needed, budget)
            shared_end = None  # over budget: the end of the messages every branch shares
            if not needed <= ends.keys():
                first = ops.boundaries[0]
                shared_end = ends.get(first)
                if shared_end is None:
                    shared_end = self.requests.message_ends(body, ids, [first])[first]
        except PromptTooLong as exc:
            raise too_long(exc, "messages", self.max_tokens) from None
        except (PromptError, ValueError, TypeError) as exc:
            raise RouterError(400, f"cannot tokenize the prompt: {exc}", param="cache") from exc
        if shared_end is not None:
            keys = self._exact(ids[:shared_end], cache_salt, lora).block_keys
            return RequestKeys(len(ids), keys, self.engine.block_size, True)
        return self._branched(ids, OpHistory.from_ops(ops, ends), cache_salt, lora)

    def _tokens_with_ops(
        self,
        ids: list[int],
        body: Mapping[str, Any],
        cache_salt: str | None,
        lora: LoraKey | None,
        max_prompt_tokens: int | None,
    ) -> RequestKeys:
        """A token prompt whose `cache.segments` say where each segment ends."""
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            over = PromptTooLong(max_prompt_tokens, len(ids), exact=True)
            raise too_long(over, "prompt", self.max_tokens)
        try:
            history = token_prompt_history(body.get("cache"), len(ids))
        except CacheOpsError as exc:
            raise RouterError(400, str(exc), param="cache") from None
        if history is None:
            return self._exact(ids, cache_salt, lora)
        return self._branched(ids, history, cache_salt, lora)

    def _branched(
        self, ids: list[int], history: OpHistory, cache_salt: str | None, lora: LoraKey | None
    ) -> RequestKeys:
        positions = history.positions(len(ids))  # repositions renumber what is left
        if self.max_tokens is not None and positions > self.max_tokens:
            over = PromptTooLong(self.max_tokens, positions, exact=True)
            raise too_long(over, "messages", self.max_tokens)
        size = self.engine.block_size
        keys = history_block_keys(
            self.hasher,
            ids,
            history,
            lora=lora,
            cache_salt=cache_salt,
            int_form=self.engine.int_block_hashes,
        )
        plan = lookup_plan(keys, history, size) if history.dropped_blocks(size) else None
        return RequestKeys(len(ids), keys, size, True, ids, plan)

    def _exact(
        self, tokens: list[int], cache_salt: str | None, lora: LoraKey | None = None
    ) -> RequestKeys:
        keys = self.hasher.block_keys(
            tokens, lora=lora, cache_salt=cache_salt, int_form=self.engine.int_block_hashes
        )
        return RequestKeys(len(tokens), keys, self.engine.block_size, True, tokens)

    def _from_digests(self, tokens: list[int], digests: list[bytes]) -> RequestKeys:
        keys = digests
        if self.engine.int_block_hashes:
            keys = [digest[-INT_KEY_SIZE:] for digest in digests]
        return RequestKeys(len(tokens), keys, self.engine.block_size, True, tokens)

    def _converted(self, body: Mapping[str, Any], kind: str, cache_salt: str | None) -> RequestKeys:
        """A Responses API or Anthropic Messages API body: approximate keys whatever the pool,
        as the engine's prompt is its own conversion of the body to chat messages."""
        if kind == "responses":
            items = body.get("input")
            if not isinstance(items, (str, list)) or not items:
                raise RouterError(
                    400, "`input` must be a non-empty string or list of items", param="input"
                )
        else:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RouterError(400, "`messages` must be a non-empty list", param="messages")
        return self._approximate(body, cache_salt, kind)

    def _approximate(
        self, body: Mapping[str, Any], cache_salt: str | None, kind: str = ""
    ) -> RequestKeys:
        limit = self.approx.max_chars
        text = responses_text(body, limit) if kind == "responses" else request_text(body, limit)
        keys = self.approx.hash_text(text, cache_salt=cache_salt)
        tokens = max(1, int(len(text) / CHARS_PER_TOKEN))
        # A chat's or a Responses body's keyed text is a rendering, not what the engine
        # tokenizes: no copies of it.
        rendered = isinstance(body.get("messages"), list) or kind in (
            "responses", "messages", "pooling"
        )  # fmt: skip
        return RequestKeys(
            tokens,
            keys,
            max(1, round(self.approx.tokens_per_block)),
            False,
            prompt_text=None if rendered else completion_text(body),
            block_chars=self.approx.block_chars,
        )


def _chat_ops(body: Mapping[str, Any], num_messages: int) -> CacheOps | None:
    """The chat body's `cache` ops, validated against its messages (RouterError 400)."""
    raw = body.get("cache")
    if isinstance(raw, Mapping) and "segments" in raw:
        raise RouterError(400, "`cache.segments` is for /v1/completions only", param="cache")
    try:
        return parse_cache_ops(raw, num_messages)
    except CacheOpsError as exc:
        raise RouterError(400, str(exc), param="cache") from None


def _approximate_salt(cache_salt: str | None, lora: LoraKey | None) -> str | None:
    """Approximate keys carry the LoRA adapter in their salt (vLLM hashes it into every block)."""
    return cache_salt if lora is None else f"{cache_salt or ''}\0lora:{lora.name}"
