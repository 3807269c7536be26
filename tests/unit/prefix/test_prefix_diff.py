"""Prefix diff: common tokens/blocks and the first differing field of two requests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.cli import main
from kvgate.prefix.diff import common_prefix_length, diff_requests, first_difference
from kvgate.prefix.prompt import RequestTokenizer
from kvgate.prefix.tokenizer import Tokenizer

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"


@pytest.fixture(scope="module")
def requests() -> RequestTokenizer:
    return RequestTokenizer(Tokenizer.from_dir(TOKENIZER_DIR))


@pytest.fixture()
def turns(conversations):
    messages = conversations["conversations"][0]["messages"]
    return {"messages": messages[:6]}, {"messages": messages[:8]}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [([], [], 0), ([1, 2], [1, 3], 1), (list(range(1000)), [*range(999), 5], 999)],
)
def test_common_prefix_length(a, b, expected):
    assert common_prefix_length(a, b) == expected
    assert common_prefix_length("abc" * 300, "abc" * 300 + "x") == 900


def test_next_turn_extends(turns, requests):
    a, b = turns
    result = diff_requests(a, b, requests=requests, block_size=16)
    ids_a = requests.chat_token_ids(a)
    assert result.kind == "extends"
    assert result.field is not None and result.field.path == "messages[6]"
    # only the generation prompt of turn A is not in turn B
    assert len(ids_a) - 8 <= result.common < len(ids_a)
    assert result.common_blocks == result.common // 16
    assert result.lengths == (len(ids_a), len(requests.chat_token_ids(b)))


def test_edited_history_diverges_at_the_edit(turns, requests):
    a, b = turns
    b = copy.deepcopy(b)
    original = b["messages"][3]["content"]
    b["messages"][3]["content"] = original[:50] + "EDITED" + original[50:]
    result = diff_requests(a, b, requests=requests)
    assert result.kind == "diverges"
    assert result.field is not None
    assert (result.field.path, result.field.char_offset) == ("messages[3].content", 50)
    assert result.field.b_excerpt.startswith(original[40:50] + "EDITED")
    # the token prefix stops inside message 3, well before turn A ends
    prefix_ids = requests.chat_token_ids({"messages": a["messages"][:3]})
    assert len(prefix_ids) - 8 < result.common < len(requests.chat_token_ids(a)) - 8


def test_changed_system_prompt_and_tools(turns):
    a, b = turns
    b2 = copy.deepcopy(b)
    b2["messages"][0]["content"] = "Today is " + b2["messages"][0]["content"]
    kind, field = first_difference(a, b2)
    assert (kind, field.path, field.char_offset) == ("diverges", "messages[0].content", 0)
    kind, field = first_difference(a, {**b, "tools": [{"type": "function"}]})
    assert (kind, field.path) == ("diverges", "tools")
    assert first_difference(a, a) == ("identical", None)


def test_completion_prompts():
    kind, field = first_difference({"prompt": "hello"}, {"prompt": "hello world"})
    assert kind == "extends" and field.char_offset == 5
    kind, field = first_difference({"prompt": [1, 2, 3]}, {"prompt": [1, 9]})
    assert (kind, field.path) == ("diverges", "prompt[1]")


def test_approximate_mode_counts_characters(turns):
    a, b = turns
    result = diff_requests(a, b, approx_block_chars=64)
    assert result.unit == "chars"
    assert result.common == result.lengths[0]  # B's text starts with all of A's
    assert result.common_blocks == result.common // 64


def test_precomputed_token_ids_skip_tokenization(turns):
    a, b = turns
    result = diff_requests(a, b, a_token_ids=[1, 2, 3, 4], b_token_ids=[1, 2, 5], block_size=2)
    assert (result.common, result.common_blocks, result.unit) == (2, 1, "tokens")


def test_prefix_diff_command(turns, tmp_path, capsys):
    a, b = turns
    b = copy.deepcopy(b)
    b["messages"][2]["content"] = "changed"
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    args = ["prefix", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert main([*args, "--tokenizer", str(TOKENIZER_DIR)]) == 0
    out = capsys.readouterr().out
    assert "first difference: messages[2].content at char 0" in out
    assert "tokens of" in out and "verdict: diverges" in out
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["unit"] == "chars" and result["field"]["path"] == "messages[2].content"


def test_prefix_diff_command_errors(tmp_path, capsys):
    (tmp_path / "a.json").write_text("[1]")
    (tmp_path / "b.json").write_text("{")
    base = ["prefix", "diff", str(tmp_path / "a.json")]
    assert main([*base, str(tmp_path / "b.json")]) == 1
    assert "must hold a request body" in capsys.readouterr().err
    (tmp_path / "a.json").write_text("{}")
    assert main([*base, str(tmp_path / "b.json")]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    (tmp_path / "b.json").write_text('{"messages": []}')
    assert main([*base, str(tmp_path / "b.json"), "--tokenizer", str(TOKENIZER_DIR)]) == 1
    assert "error" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "b.json"), "--tokenizer", str(tmp_path)]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_first_difference_of_responses_bodies_names_the_item_and_field():
    items = [{"role": "user", "content": "fix the bug"},
             {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "a.py"}]  # fmt: skip
    a = {"instructions": "be brief", "input": items}
    assert first_difference(a, {**a, "input": [*items, {"role": "user", "content": "go"}]})[0] == (
        "extends"
    )
    changed = [items[0], {**items[1], "arguments": '{"path": "."}'}, items[2]]
    kind, field = first_difference(a, {**a, "input": changed})
    assert kind == "diverges" and field is not None and field.path == "input[1].arguments"
    kind, field = first_difference(a, {**a, "instructions": "be long"})
    assert field is not None and field.path == "instructions" and field.char_offset == 3
    kind, field = first_difference({"input": "hi"}, {"input": "ho"})
    assert kind == "diverges" and field is not None and field.path == "input"
    assert first_difference(a, dict(a)) == ("identical", None)


def test_first_difference_of_anthropic_bodies_reads_the_system_first():
    a = {"system": "you are helpful", "messages": [{"role": "user", "content": "hi"}]}
    kind, field = first_difference(a, {**a, "system": "you are terse"})
    assert kind == "diverges" and field is not None and field.path == "system"


def test_responses_and_anthropic_bodies_diff_as_their_keyed_text_even_with_a_tokenizer():
    unused: Any = object()  # never asked: such bodies are not tokenized
    a = {"instructions": "be brief", "input": [{"role": "user", "content": "hi"}]}
    b = {**a, "input": [*a["input"], {"role": "user", "content": "more"}]}
    diff = diff_requests(a, b, requests=unused)
    assert diff.unit == "chars" and diff.kind == "extends"
    anthropic = {"system": "s", "messages": [{"role": "user", "content": "hi"}]}
    assert diff_requests(anthropic, anthropic, requests=unused).unit == "chars"
