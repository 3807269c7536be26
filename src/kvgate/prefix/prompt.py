"""OpenAI request bodies → the token ids vLLM will compute for them.

- ``/v1/completions``: ``prompt`` is a string (tokenized with ``add_special_tokens``, default
  true), a list of token ids (taken as given), or a batch of either (one prompt each), read
  with vLLM's rule (``kvgate.prefix.completion_prompt``).
- ``/v1/chat/completions``: ``messages`` (+ ``tools``, ``documents``, ``chat_template_kwargs``,
  ``add_generation_prompt`` default true, ``continue_final_message``, ``reasoning_effort``)
  rendered with the model's chat template (``kvgate.prefix.chat``), then tokenized with
  ``add_special_tokens`` (default false for chat, so a template's own BOS appears once).
- ``truncate_prompt_tokens: k`` cuts the prompt to k tokens as vLLM 0.33 does (`truncation`):
  -1 is the engines' ``max_model_len`` less one; ``truncation_side`` "left" keeps the last k
  ids of the whole encoding, "right" the first k; without it the tokenizer truncates on the
  left and keeps the special tokens it adds (a BOS stays first).
- ``max_tokens`` (the engines' ``max_model_len``): more prompt tokens than that raise
  ``PromptTooLong``, found before tokenizing what cannot fit (``Tokenizer.encode``); with
  truncation the whole text is tokenized first, as vLLM does, and the kept tokens are checked.

A request-supplied ``chat_template`` is refused, as vLLM refuses it, unless the engines run
with ``--trust-request-chat-template`` (``trust_request_chat_template=True``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.prefix.chat import ChatTemplate, ChatTemplateError
from kvgate.prefix.completion_prompt import PromptError, completion_prompts
from kvgate.prefix.content_format import ContentFormat
from kvgate.prefix.message_ends import MessageEnds
from kvgate.prefix.tokenizer import PromptTooLong, Tokenizer

TAIL_CHARS_PER_TOKEN = 32
"""Characters read per id kept by `truncate_prompt_tokens`, at first (ids average ~4)."""
TAIL_MARGIN_TOKENS = 64
"""Ids after a tail's cut that are dropped: a word or an added token the cut split reads as
other ids than in the whole text."""


@dataclass(frozen=True, slots=True)
class Truncation:
    """`truncate_prompt_tokens` as vLLM 0.33 applies it (``vllm/renderers/params.py``)."""

    keep: int
    side: Literal["left", "right"] | None  # `truncation_side`; None: the tokenizer's own

    def ids(self, ids: list[int]) -> list[int]:
        """Token ids cut to `keep`: the last ones, unless the side is "right" (a generating
        model's tokenizer truncates on the left)."""
        if len(ids) <= self.keep:
            return ids
        if self.keep == 0:
            return []
        return ids[: self.keep] if self.side == "right" else ids[-self.keep :]


def truncation(
    body: Mapping[str, Any], max_model_len: int | None, *, chat: bool
) -> Truncation | None:
    """The body's truncation, None for none. -1 keeps `max_model_len` less one (one token held
    back for the output) or, for a request of no output, all of it; with `max_model_len`
    unknown it is taken as none (exact for every prompt shorter than that)."""
    keep = body.get("truncate_prompt_tokens")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < -1:
        return None
    if keep == -1:
        if max_model_len is None:
            return None
        keep = max_model_len if _no_output(body, chat=chat) else max(0, max_model_len - 1)
    side = body.get("truncation_side")
    return Truncation(keep, side if side in ("left", "right") else None)


def _no_output(body: Mapping[str, Any], *, chat: bool) -> bool:
    """vLLM's `max_output_tokens == 0`: chat reads max_completion_tokens, else max_tokens
    (absent: None); completions read `max_tokens or 0` (absent: 16)."""
    if chat:
        out = body.get("max_completion_tokens")
        return (out if out is not None else body.get("max_tokens")) == 0
    return not body.get("max_tokens", 16)


def _check(ids: list[int], max_tokens: int | None) -> list[int]:
    if max_tokens is not None and len(ids) > max_tokens:
        raise PromptTooLong(max_tokens, len(ids), exact=True)
    return ids


class RequestTokenizer:
    """Turns request bodies into prompt token ids for one model (tokenizer + chat template)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None = None,
        *,
        content_format: ContentFormat | Literal["auto"] = "auto",
        trust_request_chat_template: bool = False,
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
        reasoning_effort_map: Mapping[str, str] | None = None,
    ) -> None:
        """``content_format``, ``trust_request_chat_template``, ``default_chat_template_kwargs``
        and ``reasoning_effort_map``: the vLLM flags of those names."""
        self.tokenizer = tokenizer
        self.default_chat_template_kwargs = dict(default_chat_template_kwargs or {})
        self.reasoning_effort_map = dict(reasoning_effort_map or {})
        self.content_format = content_format
        self.trust_request_chat_template = trust_request_chat_template
        # A configured template replaces the tokenizer's; of a named set, "tool_use" renders a
        # request with `tools` and "default" any other, as transformers' get_chat_template picks.
        self._named = (
            {"default": chat_template} if chat_template is not None else tokenizer.chat_templates
        )
        source = self._named.get("default")
        self.template = (
            ChatTemplate(source, tokenizer.special_tokens_map, content_format=content_format)
            if source is not None
            else None
        )
        self._request_templates: dict[str, ChatTemplate] = {}
        self._message_ends = MessageEnds()

    def completion_token_ids(
        self,
        body: Mapping[str, Any],
        *,
        vocab_size: int | None = None,
        max_tokens: int | None = None,
        max_prompts: int | None = None,
    ) -> list[list[int]]:
        """One token-id list per prompt of a ``/v1/completions`` body (`completion_prompts`'s
        rule; `vocab_size` bounds given ids where the engine's vocabulary is known); with
        ``max_prompts`` only the first ones are tokenized, at most ``max_tokens`` each."""
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise PromptError("add_special_tokens must be a boolean")
        prompts = completion_prompts(body.get("prompt"), vocab_size=vocab_size)
        if not prompts:
            raise PromptError("prompt is an empty batch")
        out: list[list[int]] = []
        cut = truncation(body, max_tokens, chat=False)
        for index, item in enumerate(prompts):
            if max_prompts is not None and index >= max_prompts:
                continue  # `completion_prompts` checked its shape already
            if isinstance(item, str):
                ids = self._encode(item, add_special, cut, max_tokens)
            else:
                ids = list(item)
                ids = _check(cut.ids(ids) if cut is not None else ids, max_tokens)
            out.append(ids)
        return out

    def _encode(
        self, text: str, add_special: bool, cut: Truncation | None, max_tokens: int | None
    ) -> list[int]:
        """`text`'s ids, cut as vLLM cuts them: with a `truncation_side` the whole encoding is
        sliced; without one the tokenizer truncates (on the left), keeping the special tokens it
        adds (a BOS stays first) and cutting the text's own ids to what is left of `keep`."""
        if cut is None or (max_tokens is not None and cut.keep > max_tokens):
            # kept whole, or longer than the cap whatever is kept: `max_tokens` bounds the work
            return self.tokenizer.encode(
                text, add_special_tokens=add_special, max_tokens=max_tokens
            )
        if cut.keep == 0:
            return []
        if cut.side == "right":
            return self._encode_first(text, add_special, cut.keep)
        affixes = self.tokenizer.special_affixes if add_special else None
        if cut.side == "left" or affixes is None:
            return self._encode_last(text, add_special, cut.keep)
        prefix, suffix = affixes
        content = max(0, cut.keep - len(prefix) - len(suffix))
        middle = self._encode_last(text, False, content) if content else []
        return [*prefix, *middle, *suffix]

    def _encode_last(self, text: str, add_special: bool, keep: int) -> list[int]:
        """The last `keep` ids of `text`, read from its end (`_encode_end`)."""
        return self._encode_end(text, add_special, keep, last=True)

    def _encode_first(self, text: str, add_special: bool, keep: int) -> list[int]:
        """The first `keep` ids of `text`, read from its start (`_encode_end`)."""
        return self._encode_end(text, add_special, keep, last=False)

    def _encode_end(self, text: str, add_special: bool, keep: int, *, last: bool) -> list[int]:
        """`keep` ids from one end of `text`, read from that end: a piece of
        `TAIL_CHARS_PER_TOKEN` characters per id, grown until it gives `TAIL_MARGIN_TOKENS`
        more than `keep` (the ids next to the cut depend on where the text was cut, so they are
        dropped). Tokenizing all of a 15 MB prompt to keep 16 ids took 16 s and 4 GiB."""
        window = (keep + TAIL_MARGIN_TOKENS) * TAIL_CHARS_PER_TOKEN
        while window < len(text):
            piece = text[-window:] if last else text[:window]
            ids = self.tokenizer.encode(piece, add_special_tokens=add_special)
            if len(ids) >= keep + TAIL_MARGIN_TOKENS:
                return ids[-keep:] if last else ids[:keep]
            window *= 4  # ids longer than the guess: a longer piece
        ids = self.tokenizer.encode(text, add_special_tokens=add_special)
        return ids[-keep:] if last else ids[:keep]

    def chat_text(self, body: Mapping[str, Any]) -> str:
        """The prompt text the model's chat template renders for a chat body."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list")
        template = self._template_for(body)
        kwargs = body.get("chat_template_kwargs")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, Mapping):
            raise PromptError("chat_template_kwargs must be an object")
        unexpected = {"chat_template", "tokenize"} & set(kwargs)
        if unexpected:
            raise PromptError(f"unexpected chat_template_kwargs: {sorted(unexpected)}")
        kwargs = dict(kwargs)
        effort = body.get("reasoning_effort")
        if effort is not None:
            effort = (
                self.reasoning_effort_map.get(effort, effort) if isinstance(effort, str) else effort
            )
            kwargs["reasoning_effort"] = effort
            kwargs.setdefault("enable_thinking", effort != "none")
        if self.default_chat_template_kwargs:  # vLLM's merge: a request's None or "auto" is unset
            given = {k: v for k, v in kwargs.items() if v not in (None, "auto")}
            kwargs = {**self.default_chat_template_kwargs, **given}
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise PromptError("tools must be a list")
        documents = body.get("documents")
        if documents is not None and not isinstance(documents, list):
            raise PromptError("documents must be a list")
        try:
            return template.render(
                messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                continue_final_message=bool(body.get("continue_final_message", False)),
                chat_template_kwargs=kwargs,
            )
        except ChatTemplateError as exc:
            raise PromptError(str(exc)) from None

    def chat_token_ids(
        self, body: Mapping[str, Any], *, max_tokens: int | None = None
    ) -> list[int]:
        """Token ids of a ``/v1/chat/completions`` body."""
        add_special = body.get("add_special_tokens", False)
        if not isinstance(add_special, bool):
            raise PromptError("add_special_tokens must be a boolean")
        cut = truncation(body, max_tokens, chat=True)
        return self._encode(self.chat_text(body), add_special, cut, max_tokens)

    def message_ends(
        self,
        body: Mapping[str, Any],
        ids: Sequence[int],
        indices: Iterable[int],
        budget: int | None = None,
    ) -> dict[int, int]:
        """For each message index i, the token offset in `ids` (the body's own ids) where
        message i ends: the ids of the first i+1 messages rendered without a generation prompt
        (remembered across turns: `kvgate.prefix.message_ends`; those past `budget` messages
        rendered are left out). Raises PromptError where those ids are not a prefix of `ids`:
        cache ops cannot be placed there."""
        return self._message_ends.ends(body, ids, indices, self.chat_token_ids, budget)

    def _template_for(self, body: Mapping[str, Any]) -> ChatTemplate:
        source = body.get("chat_template")
        if source is not None and not self.trust_request_chat_template:
            raise PromptError(
                "a chat template was passed with the request, but the engines do not trust "
                "request chat templates (vLLM --trust-request-chat-template)"
            )
        if source is not None and not isinstance(source, str):
            raise PromptError("chat_template must be a string")
        if source is None and body.get("tools") is not None and "tool_use" in self._named:
            source = self._named["tool_use"]
        elif source in self._named:  # a template's name, as vLLM resolves it
            source = self._named[source]
        if isinstance(source, str):
            template = self._request_templates.get(source)
            if template is None:
                try:
                    template = ChatTemplate(
                        source,
                        self.tokenizer.special_tokens_map,
                        content_format=self.content_format,
                    )
                except ChatTemplateError as exc:
                    raise PromptError(str(exc)) from None
                if len(self._request_templates) >= 16:
                    self._request_templates.clear()
                self._request_templates[source] = template
            return template
        if self.template is None:
            raise PromptError("the model has no chat template")
        return self.template
