"""Chat rendering equals transformers' apply_chat_template on vLLM-normalised messages."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from kvgate.prefix.chat import ChatTemplate, ChatTemplateError, normalize_messages, normalize_tools
from kvgate.prefix.tokenizer import Tokenizer

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    tok = Tokenizer.from_dir(TOKENIZER_DIR)
    assert tok.chat_template is not None
    return ChatTemplate(tok.chat_template, tok.special_tokens_map)


@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_agent_conversations_render_like_transformers(
    template, hf_tokenizer, conversations, with_tools, add_generation_prompt
):
    tools = conversations["tools"] if with_tools else None
    for conversation in conversations["conversations"]:
        messages = conversation["messages"]
        for turn in range(2, len(messages) + 1):
            raw = messages[:turn]
            expected = hf_tokenizer.apply_chat_template(
                normalize_messages(raw),
                tools=normalize_tools(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
            got = template.render(raw, tools=tools, add_generation_prompt=add_generation_prompt)
            assert got == expected


def test_continue_final_message_like_transformers(template, hf_tokenizer):
    raw = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi, I am"}]
    expected = hf_tokenizer.apply_chat_template(
        normalize_messages(raw), tokenize=False, continue_final_message=True
    )
    got = template.render(raw, add_generation_prompt=False, continue_final_message=True)
    assert got == expected
    assert got.endswith("Hi, I am")
    with pytest.raises(ChatTemplateError):
        template.render(raw, add_generation_prompt=True, continue_final_message=True)


def test_template_features_of_transformers(hf_tokenizer):
    source = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
        "|{{ tools | tojson(indent=2) }}|{{ bos_token }}{{ eos_token }}|{{ custom }}"
        "|{{ documents | tojson }}|{{ strftime_now('%Y') }}"
    )
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    messages = [{"role": "user", "content": "<b>é</b>"}] * 3
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
    got = template.render(
        messages,
        tools=tools,
        documents=[{"title": "t", "text": "x"}],
        chat_template_kwargs={"custom": 7},
    )
    expected = hf_tokenizer.apply_chat_template(
        normalize_messages(messages),
        tools=normalize_tools(tools),
        documents=[{"title": "t", "text": "x"}],
        chat_template=source,
        tokenize=False,
        add_generation_prompt=True,
        custom=7,
        bos_token="<s>",
        eos_token="</s>",
    )
    assert got == expected
    assert '"<b>é</b>"' in got  # tojson does not escape HTML or non-ASCII


def test_raise_exception_and_sandbox():
    with pytest.raises(ChatTemplateError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render([{"role": "user", "content": ""}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.append(1) }}").render([{"role": "user", "content": ""}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% if %}")
    with pytest.raises(ChatTemplateError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}").render([{"role": "user", "content": ""}])


def test_strftime_uses_injected_clock():
    template = ChatTemplate("{{ strftime_now('%d %b %Y') }}", clock=lambda: datetime(2026, 1, 2))
    assert template.render([{"role": "user", "content": "x"}]) == "02 Jan 2026"


def test_normalize_messages_follows_vllm():
    header = "x-anthropic-billing-header: cch=123\nReal system prompt"
    raw = [
        {"role": "system", "content": [{"type": "text", "text": header}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "input_text", "text": "b"},
                {"type": "text", "text": None},
                "c",
                {"type": "refusal", "refusal": "no"},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning": "think",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
                {"id": "4", "type": "function", "function": {"name": "i", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "out"}]},
        {"role": "user", "content": "c", "name": "bob"},
        {"role": "assistant", "content": "plain", "tool_calls": []},
    ]
    before = json.dumps(raw)
    out = normalize_messages(raw)
    assert json.dumps(raw) == before  # the request body is not mutated
    assert out[0] == {"role": "system", "content": "Real system prompt"}
    assert out[1]["content"] == "a\nb\nc\nno"
    assert out[2]["content"] == ""
    assert out[2]["reasoning"] == out[2]["reasoning_content"] == "think"
    args = [call["function"]["arguments"] for call in out[2]["tool_calls"]]
    assert args == [{"x": 1}, {}, {}, {}]
    assert out[3] == {"role": "tool", "content": "out", "tool_call_id": "1"}
    assert out[4] == {"role": "user", "content": "c", "name": "bob"}
    assert out[5] == {"role": "assistant", "content": "plain"}  # empty tool_calls dropped


def test_developer_messages_become_one_system_message():
    raw = [
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d"},
        {"role": "system", "content": "s"},
    ]
    assert normalize_messages(raw, supports_developer_role=False) == [
        {"role": "system", "content": "d\n\ns"},
        {"role": "user", "content": "u"},
    ]
    assert normalize_messages(raw)[1] == {"role": "developer", "content": "d", "tools": None}


@pytest.mark.parametrize(
    "bad",
    [
        [{"content": "no role"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": 5}],
        [{"role": "assistant", "content": "", "tool_calls": "x"}],
    ],
)
def test_bad_messages_are_clear_errors(template, bad):
    with pytest.raises(ChatTemplateError):
        template.render(bad)


def test_tools_dump_like_vllm():
    tools = [
        {"type": "function", "function": {"name": "a"}},
        {
            "type": "function",
            "defer_loading": True,
            "function": {"name": "b", "description": "d", "parameters": {}, "strict": True},
        },
    ]
    assert normalize_tools(tools) == [
        {"type": "function", "function": {"name": "a", "description": None, "parameters": None}},
        {
            "type": "function",
            "function": {
                "name": "b",
                "description": "d",
                "parameters": {},
                "strict": True,
                "defer_loading": True,
            },
            "defer_loading": True,
        },
    ]


# A Llama-3-style template: namespace(), trim, `is defined`, strftime_now and a date default.
LLAMA_STYLE = (TOKENIZER_DIR.parent / "templates" / "llama_style.jinja").read_text()


@pytest.mark.parametrize("kwargs", [{}, {"date_string": "01 Jan 2026"}])
def test_second_template_style_renders_like_transformers(hf_tokenizer, conversations, kwargs):
    template = ChatTemplate(LLAMA_STYLE, {"bos_token": "<s>", "eos_token": "<|im_end|>"})
    tools = conversations["tools"]
    for conversation in conversations["conversations"]:
        raw = conversation["messages"]
        expected = hf_tokenizer.apply_chat_template(
            normalize_messages(raw),
            tools=normalize_tools(tools),
            chat_template=LLAMA_STYLE,
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        assert template.render(raw, tools=tools, chat_template_kwargs=kwargs) == expected


def test_attribute_lookup_on_messages_keeps_jinja_semantics(hf_tokenizer):
    # dict methods win over keys of the same name; missing keys are undefined
    source = (
        "{% for m in messages %}{{ m.keys is callable }}|{{ m.content }}|{{ m.role }}"
        "|{{ m.missing is defined }}|{{ m['keys'] }}{% endfor %}"
    )
    messages = [{"role": "user", "content": "c"}]
    conversation = normalize_messages(messages)
    conversation[0]["keys"] = "k"
    expected = hf_tokenizer.apply_chat_template(conversation, chat_template=source, tokenize=False)
    template = ChatTemplate(source)
    assert template._template.render(messages=conversation) == expected == "True|c|user|False|k"
