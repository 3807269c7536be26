"""Message ends in tokens (for cache ops), remembered across a session's turns."""

from __future__ import annotations

import pytest
from tests.unit.prefix.conftest import TOKENIZER_DIR

from kvgate.prefix import PromptError, RequestTokenizer, Tokenizer
from kvgate.prefix.message_ends import MessageEnds


def _body(turns: int) -> dict[str, object]:
    messages = [{"role": "system", "content": "You fix bugs."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"observation {turn} " * 15})
        messages.append({"role": "assistant", "content": f"action {turn}"})
    return {"messages": messages}


def test_ends_are_the_heads_token_counts_and_later_turns_render_only_new_ones() -> None:
    requests = RequestTokenizer(Tokenizer.from_dir(TOKENIZER_DIR))
    body = _body(6)
    ids = requests.chat_token_ids(body)
    ends = requests.message_ends(body, ids, [1, 3, 5])
    for i, n in ends.items():
        head = {**body, "messages": body["messages"][: i + 1], "add_generation_prompt": False}
        assert n == len(requests.chat_token_ids(head))
    assert ends[1] < ends[3] < ends[5] < len(ids)
    memo = requests._message_ends
    rendered = memo.rendered
    longer = _body(8)
    longer_ids = requests.chat_token_ids(longer)
    assert requests.message_ends(longer, longer_ids, [1, 3, 5, 7, 9]) == {
        **ends,
        **requests.message_ends(longer, longer_ids, [7, 9]),
    }
    assert memo.rendered == rendered + 2  # 7 and 9 only


def test_a_head_that_is_not_a_prefix_is_refused() -> None:
    memo = MessageEnds()
    body = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    with pytest.raises(PromptError, match="renders message 0 differently"):
        memo.ends(body, [1, 2, 3, 4], [0], lambda head: [9, 9])
    # remembered, and checked again against the next prompt's own ids
    assert memo.ends(body, [9, 9, 3], [0], lambda head: pytest.fail("rendered again")) == {0: 2}


def test_a_request_renders_new_ends_up_to_its_budget_and_later_turns_go_on() -> None:
    """Naming every boundary of a long history cost a render of each head (2,000 messages:
    2 million messages rendered, 9.8 s): the ends past the budget are left out, lowest first
    kept, and the next turn renders on from them."""
    memo = MessageEnds()
    messages = [{"role": "user", "content": str(i)} for i in range(10)]
    body = {"messages": messages}
    ids = list(range(10))
    heads: list[int] = []

    def head_ids(head):
        heads.append(len(head["messages"]))
        return ids[: len(head["messages"])]

    assert memo.ends(body, ids, range(10), head_ids, budget=10) == {0: 1, 1: 2, 2: 3, 3: 4}
    assert heads == [1, 2, 3, 4]  # 10 messages rendered
    heads.clear()
    assert memo.ends(body, ids, range(10), head_ids, budget=10) == {i: i + 1 for i in range(5)}
    assert heads == [5]  # 6 more would be over
