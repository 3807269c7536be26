"""Request bodies → the token ids vLLM computes (chat via transformers, completions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.prefix.chat import normalize_messages, normalize_tools
from kvgate.prefix.prompt import PromptError, RequestTokenizer
from kvgate.prefix.tokenizer import PromptTooLong, Tokenizer

TOKENIZER_DIR = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"


@pytest.fixture(scope="module")
def requests() -> RequestTokenizer:
    return RequestTokenizer(Tokenizer.from_dir(TOKENIZER_DIR))


def test_chat_ids_equal_transformers_render_then_tokenize(requests, hf_tokenizer, conversations):
    tools = conversations["tools"]
    for conversation in conversations["conversations"]:
        body = {"model": "m", "messages": conversation["messages"], "tools": tools}
        text = hf_tokenizer.apply_chat_template(
            normalize_messages(body["messages"]),
            tools=normalize_tools(tools),
            tokenize=False,
            add_generation_prompt=True,
        )
        expected = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = requests.chat_token_ids(body)
        assert ids == expected
        assert ids.count(hf_tokenizer.bos_token_id) == 1  # from the template, not added twice


def test_chat_add_special_tokens_true_adds_bos_again(requests, hf_tokenizer):
    body = {"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True}
    ids = requests.chat_token_ids(body)
    assert ids[:2] == [hf_tokenizer.bos_token_id] * 2


def test_completion_prompts(requests, hf_tokenizer):
    text = "def main():\n    return 1\n"
    assert requests.completion_token_ids({"prompt": text}) == [hf_tokenizer(text)["input_ids"]]
    no_bos = requests.completion_token_ids({"prompt": text, "add_special_tokens": False})
    assert no_bos == [hf_tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert requests.completion_token_ids({"prompt": [5, 6, 7]}) == [[5, 6, 7]]
    batch = requests.completion_token_ids({"prompt": ["a", "b"]})
    assert batch == [hf_tokenizer("a")["input_ids"], hf_tokenizer("b")["input_ids"]]
    assert requests.completion_token_ids({"prompt": [[1, 2], [3]]}) == [[1, 2], [3]]
    with pytest.raises(PromptError):  # vLLM refuses a batch mixing texts and token ids
        requests.completion_token_ids({"prompt": ["a", [1, 2]]})
    assert requests.completion_token_ids({"prompt": [1, 2, 3], "truncate_prompt_tokens": 2}) == [
        [2, 3]
    ]


def test_truncation_reads_the_prompt_from_its_end(requests, hf_tokenizer, monkeypatch):
    """`truncate_prompt_tokens` as vLLM 0.33 applies it: without `truncation_side` the
    tokenizer (loaded with truncation_side="left") truncates, keeping the BOS it adds and the
    text's last ids; the ids are read from a tail of the text (a 15 MB prompt tokenized whole
    to keep 16 ids took 16 s and 4 GiB)."""
    import random

    rng = random.Random(7)
    words = ["alpha", "beta", "<|im_start|>", "\n", "  ", "x" * 40, "123456", "é", "🙂", "def"]
    text = " ".join(rng.choice(words) for _ in range(20_000))
    tokenizer = requests.tokenizer
    whole = tokenizer.encode(text)
    hf_tokenizer.truncation_side = "left"  # what vLLM loads a generating model's with
    seen: list[int] = []
    encode = tokenizer.encode

    def spy(piece, **kwargs):
        seen.append(len(piece))
        return encode(piece, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", spy)
    for keep in (1, 16, 500, 3000):
        seen.clear()
        body = {"prompt": text, "truncate_prompt_tokens": keep}
        vllm = hf_tokenizer(text, truncation=True, max_length=keep)["input_ids"]
        assert requests.completion_token_ids(body) == [vllm]
        assert vllm[0] == hf_tokenizer.bos_token_id and len(vllm) == keep
        if keep > 1:
            assert seen == [min(len(text), (keep - 1 + 64) * 32)]  # one tail was enough
        # With a side, the whole encoding is sliced: the BOS goes on the left, stays on the right.
        left = {**body, "truncation_side": "left"}
        assert requests.completion_token_ids(left) == [whole[-keep:]]
        right = {**body, "truncation_side": "right"}
        assert requests.completion_token_ids(right) == [whole[:keep]]
    at_cap = {"prompt": text, "truncate_prompt_tokens": 1000}  # keeps as many as the cap
    vllm = hf_tokenizer(text, truncation=True, max_length=1000)["input_ids"]
    assert requests.completion_token_ids(at_cap, max_tokens=1000) == [vllm]
    body = {"prompt": "a " * 200_000, "truncate_prompt_tokens": 10**9}
    with pytest.raises(PromptTooLong):  # kept whole, over the cap: the cap bounds the work
        requests.completion_token_ids(body, max_tokens=1000)


def test_truncating_to_minus_one_keeps_the_context_less_one_token(requests, hf_tokenizer):
    """-1 is `max_model_len` less one (a token held back for the output), or all of it for a
    request of no output; vLLM serves such a prompt, where the router answered 400."""
    text = "alpha beta " * 3000
    hf_tokenizer.truncation_side = "left"
    body = {"prompt": text, "truncate_prompt_tokens": -1, "max_tokens": 8}
    expected = hf_tokenizer(text, truncation=True, max_length=999)["input_ids"]
    assert requests.completion_token_ids(body, max_tokens=1000) == [expected]
    no_output = {**body, "max_tokens": 0}
    expected = hf_tokenizer(text, truncation=True, max_length=1000)["input_ids"]
    assert requests.completion_token_ids(no_output, max_tokens=1000) == [expected]
    ids = {"prompt": list(range(5000)), "truncate_prompt_tokens": -1}
    assert requests.completion_token_ids(ids, max_tokens=1000) == [list(range(4001, 5000))]
    chat = {"messages": [{"role": "user", "content": text}], "truncate_prompt_tokens": -1}
    assert len(requests.chat_token_ids(chat, max_tokens=1000)) == 999
    short = {"prompt": "alpha", "truncate_prompt_tokens": -1}  # max_model_len unknown
    assert requests.completion_token_ids(short) == [hf_tokenizer("alpha")["input_ids"]]


@pytest.fixture(scope="module")
def trusting() -> RequestTokenizer:
    return RequestTokenizer(Tokenizer.from_dir(TOKENIZER_DIR), trust_request_chat_template=True)


def test_request_chat_template_needs_trust(requests, trusting):
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 'fixed' }}"}
    assert trusting.chat_text(body) == "fixed"
    with pytest.raises(PromptError, match="trust"):
        requests.chat_text(body)
    with pytest.raises(PromptError, match="unexpected"):
        trusting.chat_text({**body, "chat_template_kwargs": {"chat_template": "x"}})


def test_reasoning_effort_reaches_the_template(trusting):
    requests = trusting
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "chat_template": "{{ reasoning_effort }}/{{ enable_thinking }}",
        "reasoning_effort": "low",
    }
    assert requests.chat_text(body) == "low/True"


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": None},
        {"prompt": []},
        {"prompt": [1, -1]},
        {"prompt": [{"x": 1}]},
        {"prompt": "x", "add_special_tokens": "yes"},
    ],
)
def test_bad_completion_bodies(requests, body):
    with pytest.raises(PromptError):
        requests.completion_token_ids(body)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}], "tools": "x"},
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []},
        {"messages": [{"role": "user", "content": "x"}], "chat_template": "{% if %}"},
        {"messages": [{"role": "user", "content": "x"}], "chat_template": 5},
        {"messages": [{"role": "robot", "content": "x"}]},
    ],
)
def test_bad_chat_bodies(trusting, body):
    with pytest.raises(PromptError):
        trusting.chat_token_ids(body)


def test_a_named_template_set_renders_tools_with_tool_use(tmp_path):
    """Tokenizers such as Hermes-2-Pro ship templates by name: transformers (so vLLM) renders a
    request with `tools` with "tool_use", any other with "default"; every tools request was
    rendered with "default" (keys no engine computed)."""
    import json
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    default = config["chat_template"]
    tool_use = "{{ bos_token }}TOOLS {{ (tools or []) | length }}: {{ messages[0]['content'] }}"
    config["chat_template"] = [
        {"name": "default", "template": default},
        {"name": "tool_use", "template": tool_use},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    named = RequestTokenizer(Tokenizer.from_dir(tmp_path), trust_request_chat_template=True)
    plain = RequestTokenizer(Tokenizer.from_dir(TOKENIZER_DIR))
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert named.chat_text(body) == plain.chat_text(body)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert named.chat_text({**body, "tools": tools}).endswith("TOOLS 1: hi")
    assert named.chat_text({**body, "chat_template": "tool_use"}).endswith("TOOLS 0: hi")


def test_the_engines_default_template_kwargs_and_effort_map_render_as_vllm_renders():
    """vLLM merges --default-chat-template-kwargs under a request's own (a None or "auto" of
    the request's leaves the default) and rewrites reasoning_effort by --reasoning-effort-map."""
    template = (
        "{{ bos_token }}Reasoning: {{ reasoning_effort or 'medium' }}; "
        "thinking {{ enable_thinking }}; {{ messages[0]['content'] }}"
    )
    tokenizer = Tokenizer.from_dir(TOKENIZER_DIR)
    engines = RequestTokenizer(
        tokenizer,
        template,
        default_chat_template_kwargs={"reasoning_effort": "high", "enable_thinking": False},
        reasoning_effort_map={"medium": "low"},
    )
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert engines.chat_text(body).endswith("Reasoning: high; thinking False; hi")
    mine = {**body, "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": None}}
    assert engines.chat_text(mine).endswith("Reasoning: high; thinking True; hi")
    mapped = {**body, "reasoning_effort": "medium"}
    assert engines.chat_text(mapped).endswith("Reasoning: low; thinking True; hi")
