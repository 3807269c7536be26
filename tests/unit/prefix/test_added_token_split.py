"""The split on added tokens (`kvgate.prefix.added_token_split`): leftmost-longest, two stages,
in time linear in the text even where many tokens share a long prefix."""

from __future__ import annotations

import random

from kvgate.prefix.added_token_split import AddedTokenSplit

BAR = "\uff5c"  # DeepSeek's full-width bar
PREFIX = f"<{BAR}place\u2581holder\u2581no\u2581"


def _leftmost_longest(text: str, tokens: list[str]) -> list[str]:
    """The obvious split: at each position the longest token that starts there, else a char."""
    out, start, at = [], 0, 0
    while at < len(text):
        found = max((t for t in tokens if t and text.startswith(t, at)), key=len, default=None)
        if found is None:
            at += 1
            continue
        out += [text[start:at], found]
        at += len(found)
        start = at
    return [*out, text[start:]]


def test_the_split_is_leftmost_longest_over_random_token_sets():
    rng = random.Random(0)
    for _ in range(300):
        alphabet = "ab<|>"[: rng.randint(2, 5)]
        tokens = list(
            {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(8)}
        )
        text = "".join(rng.choice(alphabet + "xy") for _ in range(rng.randint(0, 80)))
        assert AddedTokenSplit(tokens).split(text) == _leftmost_longest(text, tokens), (
            tokens,
            text,
        )


def test_the_second_stage_splits_only_between_the_firsts_tokens():
    split = AddedTokenSplit(["<x>"], ["q<x", "<z>"])
    assert split.split("q<x><z>") == ["q", "<x>", "", "<z>", ""]
    assert split.split("q<xy") == ["", "q<x", "y"]
    assert split.lookahead == 3 + 3


def test_many_tokens_sharing_a_prefix_cost_a_path_per_position():
    """1,000 tokens sharing a 17-character prefix (as DeepSeek V3's placeholders do) against a
    text of that prefix repeated: each position walks the shared prefix once. Counted in
    characters compared, not timed: the pattern has one branch per distinct next character."""
    tokens = [f"{PREFIX}{n}{BAR}>" for n in range(1000)]
    split = AddedTokenSplit(tokens)
    pattern = split._raw.pattern if split._raw is not None else ""
    assert pattern.count("place") == 1  # the shared prefix is written once
    text = PREFIX * 2000 + tokens[999]
    assert split.split(text) == [PREFIX * 2000, tokens[999], ""]


def test_a_trie_too_deep_to_compile_falls_back_to_the_plain_alternation():
    tokens = ["a" * n for n in range(1, 2000)]  # 1,999 nested ends: too deep to recurse
    assert AddedTokenSplit(tokens).split("b" + "a" * 2500) == ["b", "a" * 1999, "", "a" * 501, ""]
