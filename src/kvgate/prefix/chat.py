"""Chat messages → prompt text, exactly as vLLM 0.33 renders a `/v1/chat/completions` request.

Two steps, each mirroring the code that runs in the engine:

1. **Normalise the messages** as vLLM's ``parse_chat_messages`` does. For templates that
   take string content (``kvgate.prefix.content_format``) text parts are joined with ``"\\n"``
   (``None`` content → ``""``); templates that loop over content get a list of
   ``{"type": "text", "text": ...}`` parts (tool results stay strings). The
   attribution header line Claude Code puts in system prompts is dropped; assistant
   ``tool_calls`` and ``reasoning`` (also as ``reasoning_content``), tool ``tool_call_id``,
   ``name``, ``task`` are kept; tool-call ``arguments`` strings are parsed into objects (invalid
   or non-object JSON → ``{}``; an empty ``tool_calls`` list is dropped). Developer messages
   become system messages (merged into one at position 0) when the template does not mention
   the ``developer`` role. Tools are re-serialised as vLLM's pydantic models dump them.
2. **Render the template** as transformers' ``apply_chat_template(tokenize=False)``: a
   Jinja ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the
   ``loopcontrols`` extension and a ``{% generation %}`` tag, a ``tojson`` filter that does not
   escape HTML (``json.dumps(ensure_ascii=False)``), ``raise_exception`` and ``strftime_now``
   globals; variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the
   tokenizer's special tokens (``bos_token``, ``eos_token``, ...), then the request's
   ``chat_template_kwargs``. ``continue_final_message`` cuts the text after the final message
   as transformers does.

Only text content is supported; images, audio and other parts raise ``ChatTemplateError``
(the router then falls back to approximate mode for that request).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvgate.prefix.content_format import ContentFormat, detect_content_format

_BILLING_HEADER = "x-anthropic-billing-header"
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad message, unsupported content, template error)."""


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _SandboxForDicts(ImmutableSandboxedEnvironment):
    """The sandbox, minus an exception per ``message.role`` on a plain dict.

    For ``obj.name`` Jinja tries the Python attribute, and on ``AttributeError`` the item.
    On a plain ``dict`` a name that is not a dict attribute can only be an item, so looking
    the item up first gives the same value without raising and catching an exception.
    """

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (assistant-mask marker)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class ChatTemplate:
    """A compiled chat template plus the tokenizer's special tokens."""

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str] | None = None,
        *,
        content_format: ContentFormat | Literal["auto"] = "auto",
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = _SandboxForDicts(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from None
        self.supports_developer_role = '"developer"' in source or "'developer'" in source
        self.content_format: ContentFormat = (
            detect_content_format(source, env) if content_format == "auto" else content_format
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM renders for a chat request (raw OpenAI messages and tools)."""
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        conversation = normalize_messages(
            messages, self.supports_developer_role, self.content_format
        )
        if not conversation:
            raise ChatTemplateError("messages must not be empty")
        final_text = _mark_final_message(conversation) if continue_final_message else ""
        # vLLM merges its own arguments over the request's chat_template_kwargs; transformers
        # renders with {**special_tokens_map, **kwargs} plus its named arguments.
        kwargs = {
            k: v
            for k, v in (chat_template_kwargs or {}).items()
            if k not in {"chat_template", "tokenize", "continue_final_message"}
        }
        if documents is not None:
            kwargs["documents"] = list(documents)
        context: dict[str, Any] = {**self.special_tokens, **kwargs}
        context["messages"] = conversation
        context["tools"] = normalize_tools(tools) if tools is not None else None
        context.setdefault("documents", None)
        context["add_generation_prompt"] = add_generation_prompt
        try:
            text = self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template rejected the request: {exc}") from None
        except Exception as exc:  # as vLLM: any failure inside the template is a bad request
            raise ChatTemplateError(f"chat template failed: {exc!r}") from None
        if continue_final_message:
            text = _cut_after_final_message(text, final_text)
        return text


def _mark_final_message(conversation: list[dict[str, Any]]) -> str:
    """transformers: tag the end of the last message's (last) text so the cut can find it."""
    final = conversation[-1].get("content")
    if isinstance(final, str):
        conversation[-1]["content"] = final + _CONTINUE_TAG
        return final
    if isinstance(final, list):
        for part in reversed(final):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text: str = part["text"]
                part["text"] = text + _CONTINUE_TAG
                return text
    raise ChatTemplateError("continue_final_message needs text in the last message")


def _cut_after_final_message(text: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in text or tag not in text:
        raise ChatTemplateError("the chat template dropped the final message to continue")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


# Text part types and the key holding their text (vLLM's MM_PARSER_MAP); others are media.
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


# Part fields vLLM knows; any other field of a text part is kept in "openai" format.
_KNOWN_PART_FIELDS = frozenset(
    {"type", "text", "refusal", "thinking", "uuid", "image_url", "input_audio", "audio_url"}
    | {"video_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "data"}
    | {"prompt_embeds", "tool_reference", "file"}
)


def _text_parts(role: str, content: Any) -> list[tuple[str, dict[str, Any]]]:
    """The text of each part, with the part's extra fields (for "openai" content)."""
    if content is None:
        return []
    if isinstance(content, str):
        parts: list[Any] = [content]
    elif isinstance(content, list):
        parts = list(content)
    else:
        raise ChatTemplateError(f"{role} message content must be a string or a list of parts")
    texts: list[tuple[str, dict[str, Any]]] = []
    for part in parts:
        strippable = isinstance(part, str)
        extra: dict[str, Any] = {}
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS and "uuid" not in part:
            text = part.get(_TEXT_PARTS[part["type"]])
            strippable = part["type"] == "text"
            if text is None:  # vLLM skips text parts without text
                continue
            if not isinstance(text, str):
                raise ChatTemplateError(f"{role} message has a non-string {part['type']} part")
            extra = {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(f"unsupported content part {str(kind)[:40]!r} (text only)")
        if role == "system" and strippable and text.startswith(_BILLING_HEADER):
            text = text.partition("\n")[2]
            if not text:
                continue
        texts.append((text, extra))
    return texts


def _content(role: str, content: Any, content_format: ContentFormat) -> str | list[Any]:
    flat = content_format == "string" or role == "tool"
    if (
        flat
        and type(content) is str
        and not (role == "system" and content.startswith(_BILLING_HEADER))
    ):
        return content  # what the general path gives a plain string (the hot path)
    parts = _text_parts(role, content)
    if flat:  # vLLM flattens tool results to text
        return "\n".join(text for text, _ in parts)
    return [{"type": "text", "text": text, **extra} for text, extra in parts]


def _parse_arguments(arguments: Any) -> dict[str, Any]:
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def normalize_messages(
    messages: Sequence[Mapping[str, Any]],
    supports_developer_role: bool = True,
    content_format: ContentFormat = "string",
) -> list[dict[str, Any]]:
    """vLLM's ``parse_chat_messages`` for text-only requests."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{index}] must be an object with a string role")
        role = message["role"]
        result: dict[str, Any] = {
            "role": role,
            "content": _content(role, message.get("content"), content_format),
        }
        if role == "assistant":
            tool_calls = message.get("tool_calls")
            if tool_calls is not None:
                calls = _tool_calls(index, tool_calls)
                if calls:  # vLLM drops an empty list: templates take the plain path
                    result["tool_calls"] = calls
            reasoning = message.get("reasoning")
            if reasoning is not None:
                result["reasoning"] = reasoning
                result["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            result["name"] = message["name"]
        if isinstance(message.get("task"), str):
            result["task"] = message["task"]
        if role == "developer":
            result["tools"] = message.get("tools")
        out.append(result)
    if not supports_developer_role and any(m["role"] == "developer" for m in out):
        out = _merge_system_messages(out)
    return out


def _tool_calls(index: int, tool_calls: Any) -> list[Any]:
    """Copies of the calls with ``arguments`` parsed (the request body is left untouched)."""
    if not isinstance(tool_calls, list):
        raise ChatTemplateError(f"messages[{index}].tool_calls must be a list")
    calls: list[Any] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ChatTemplateError(f"messages[{index}].tool_calls entries must be functions")
        arguments = _parse_arguments(function.get("arguments"))
        calls.append({**call, "function": {**function, "arguments": arguments}})
    return calls


def _merge_system_messages(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM: developer → system, and all system messages merged into one at position 0."""
    converted: list[dict[str, Any]] = []
    for message in conversation:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"}
            message["role"] = "system"
        converted.append(message)
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    merged = "\n\n".join(m["content"] for m in converted if m["role"] == "system" and m["content"])
    return [{"role": "system", "content": merged}] + [m for m in converted if m["role"] != "system"]


def normalize_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools as vLLM's ``ChatCompletionToolsParam.model_dump()`` hands them to the template."""
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"tools[{index}] must be a function with a name")
        defer = tool.get("defer_loading")
        dumped: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        function_defer = function.get("defer_loading")
        if function_defer is None:
            function_defer = defer
        if function_defer is not None:
            dumped["defer_loading"] = function_defer
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if defer is not None:
            entry["defer_loading"] = defer
        out.append(entry)
    return out
