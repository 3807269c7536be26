"""Approximate character-block keys: chained, salted, stable across resent histories."""

from __future__ import annotations

import pytest

from kvgate.prefix.approx import ApproxBlockHasher, request_text


def test_only_full_blocks_and_chaining():
    hasher = ApproxBlockHasher(block_chars=4)
    assert hasher.hash_text("abc") == []
    keys = hasher.hash_text("abcdefghij")
    assert len(keys) == 2
    assert all(len(k) == 8 for k in keys)
    assert hasher.hash_text("abcdXXXX")[0] == keys[0]
    assert hasher.hash_text("XXXXefgh")[1] != keys[1]  # same block text, different parent


def test_model_and_salt_separate_keys():
    hasher = ApproxBlockHasher(block_chars=4)
    base = hasher.hash_text("abcdefgh", model="m")
    assert hasher.hash_text("abcdefgh", model="other") != base
    assert hasher.hash_text("abcdefgh", model="m", cache_salt="t") != base
    assert hasher.hash_text("abcdefgh", model="m") == base


def test_max_blocks_caps_the_chain():
    assert len(ApproxBlockHasher(block_chars=2, max_blocks=3).hash_text("x" * 100)) == 3


def test_growing_chat_history_keeps_its_keys():
    hasher = ApproxBlockHasher(block_chars=16)
    turn1 = {
        "messages": [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "q"}]
    }
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "a" * 50}]}
    keys1, keys2 = hasher.hash_request(turn1), hasher.hash_request(turn2)
    assert keys2[: len(keys1)] == keys1


def test_request_text_forms():
    assert request_text({"prompt": "hello"}) == "hello"
    assert request_text({"prompt": [1, 2, 3]}) == "1 2 3"
    assert request_text({"prompt": [[4, 5]]}) == "4 5"
    chat = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    text = request_text(chat)
    assert text.startswith("<|tools|>") and text.endswith("<|user|>\nhi\n")
    assert request_text({}) == ""


def test_bad_block_size():
    with pytest.raises(ValueError):
        ApproxBlockHasher(block_chars=0)


def test_a_rendering_stops_where_the_keys_stop_reading() -> None:
    """Millions of items were rendered whole (8 s for 3.5M) before the block cap kept the
    first of them: the rendering stops once it holds the characters the keys read, or one
    item per 64 of them (tiny items are bounded in number too), and where items are longer
    its keys are those of the whole rendering."""
    hasher = ApproxBlockHasher(block_chars=16, max_blocks=256)  # 4,096 characters
    parts = [{"type": "text", "text": f"part {i}"} for i in range(50_000)]
    tiny = [
        {"input": [1] * 100_000},
        {"messages": [{"role": "user", "content": parts}]},
        {"messages": [{"role": "user", "content": f"m{i}"} for i in range(100_000)]},
    ]
    tools = {"tools": [{"n": i} for i in range(100_000)], "messages": []}
    assert request_text(tools, hasher.max_chars) == request_text(
        {**tools, "tools": tools["tools"][:64]}
    )
    for body in tiny:
        whole, cut = request_text(body), request_text(body, hasher.max_chars)
        assert whole.startswith(cut) and 0 < len(cut) <= 4096
    long = [
        {"input": [{"role": "user", "content": f"turn {i} " + "x" * 80} for i in range(100_000)]},
        {"messages": [{"role": "user", "content": f"m{i} " + "y" * 80} for i in range(100_000)]},
        {"prompt": list(range(100_000))},
    ]
    for body in long:
        whole, cut = request_text(body), request_text(body, hasher.max_chars)
        assert whole.startswith(cut) and 4096 <= len(cut) <= 8 * 4096
        assert hasher.hash_request(body) == hasher.hash_text(whole)
        assert len(hasher.hash_request(body)) == 256
