"""Content-format detection agrees with vLLM's own (recorded vectors); "openai" rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.prefix.chat import ChatTemplate, normalize_messages, normalize_tools

DATA = Path(__file__).parents[2] / "data" / "prefix"
EXPECTED = json.loads((DATA / "templates" / "content_formats.json").read_text())


def _source(name: str) -> str:
    if name == "tokenizer_config.json":
        return str(json.loads((DATA / "tokenizer" / name).read_text())["chat_template"])
    return (DATA / "templates" / name).read_text()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detection_matches_vllm(name):
    assert ChatTemplate(_source(name)).content_format == EXPECTED[name]


def test_vectors_cover_both_formats():
    assert set(EXPECTED.values()) == {"string", "openai"}


def test_openai_content_parts():
    raw = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"x": 1}}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "t"}]},
    ]
    out = normalize_messages(raw, content_format="openai")
    assert out[0]["content"] == [{"type": "text", "text": "sys"}]
    assert out[1]["content"] == [{"type": "text", "text": "a", "cache_control": {"x": 1}}]
    assert out[2]["content"] == []
    assert out[3]["content"] == "t"  # tool results are flattened to text


@pytest.mark.parametrize(
    "name",
    ["gemma_style.jinja", "macro_content.jinja", "namespace_alias.jinja", "content_var.jinja"],
)
def test_openai_templates_render_like_transformers(hf_tokenizer, conversations, name):
    source = _source(name)
    template = ChatTemplate(source, {"bos_token": "<s>"})
    assert template.content_format == "openai"
    for conversation in conversations["conversations"]:
        raw = [m for m in conversation["messages"] if m["role"] != "tool"]
        raw = [{**m, "tool_calls": None} if "tool_calls" in m else m for m in raw]
        expected = hf_tokenizer.apply_chat_template(
            normalize_messages(raw, content_format="openai"),
            chat_template=source,
            tokenize=False,
            add_generation_prompt=True,
            bos_token="<s>",
        )
        assert template.render(raw) == expected


def test_a_list_only_template_needs_the_openai_form():
    source = _source("namespace_alias.jinja")
    raw = [{"role": "user", "content": "hello"}]
    assert ChatTemplate(source).render(raw) == "[user]hello"
    assert ChatTemplate(source, content_format="string").render(raw) == "[user]"


def test_explicit_format_overrides_detection(conversations):
    template = ChatTemplate(_source("gemma_style.jinja"), content_format="string")
    assert template.content_format == "string"
    assert normalize_tools([]) == []


def test_continue_final_message_with_content_parts(hf_tokenizer):
    source = _source("gemma_style.jinja")
    raw = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi, I"}]
    expected = hf_tokenizer.apply_chat_template(
        normalize_messages(raw, content_format="openai"),
        chat_template=source,
        tokenize=False,
        continue_final_message=True,
        bos_token="<s>",
    )
    got = ChatTemplate(source, {"bos_token": "<s>"}).render(
        raw, add_generation_prompt=False, continue_final_message=True
    )
    assert got == expected and got.endswith("Hi, I")
