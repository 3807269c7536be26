"""A text split on a tokenizer's added tokens, as the ``tokenizers`` library splits it.

The library splits in two stages: first on the added tokens matched on the raw text
(``normalized=False``), then, in each piece between them, on those matched on the normalised
text (``normalized=True``, e.g. DeepSeek V3's turn and tool-call tokens); each stage takes the
leftmost match and, at one position, the longest token. Where the tokenizer has no normaliser
(or an empty one) the normalised text is the raw text, so both stages match literals, which is
all this does, with a regular expression of the tokens written as a trie (leftmost-longest).

``lookahead``: how far past a position the split may look to decide it. A stage decides a
position by the text up to its longest token ahead, and the second stage also by where the
first cut the piece, which is decided up to the first stage's longest token further: the two
maxima added (``kvgate.router.core.reuse`` relies on this).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def _alternation(tokens: list[str]) -> re.Pattern[str] | None:
    """One capturing group matching, at the leftmost position, the longest of ``tokens``.

    The tokens are written as a trie (one branch per distinct next character, a shared run
    written once): at each position the engine follows one path, so a near miss costs the
    length of the path, not one attempt per token (1,283 DeepSeek V3 tokens sharing a
    two-character prefix made a text of that prefix repeated cost 4 ms per thousand
    characters as a plain alternation). Each node tries its longer continuations first and
    ends at itself last, so the match is the longest token."""
    trie: dict[str, Any] = {}
    for token in tokens:
        if token:
            node = trie
            for char in token:
                node = node.setdefault(char, {})
            node[_END] = True
    if not trie:
        return None
    try:
        return re.compile("(" + _node_pattern(trie) + ")")
    except (RecursionError, re.error):  # a trie thousands of branchings deep: the plain way
        alternatives = sorted(filter(None, tokens), key=len, reverse=True)
        return re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")


_END = ""  # the key marking a token's end in a trie node (no token character is empty)


def _node_pattern(node: dict[str, Any]) -> str:
    """The pattern of the continuations below ``node`` (longest first, then the end)."""
    branches = []
    for char, child in node.items():
        if char == _END:
            continue
        run = char
        while len(child) == 1 and _END not in child:  # a chain: one literal run
            (char, child) = next(iter(child.items()))
            run += char
        rest = _node_pattern(child) if any(key != _END for key in child) else ""
        optional = _END in child and rest
        branches.append(re.escape(run) + (f"(?:{rest})?" if optional else rest))
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


class AddedTokenSplit:
    """``split(text)``: pieces of text alternating with the added tokens between them."""

    def __init__(self, raw: Iterable[str], normalized: Iterable[str] = ()) -> None:
        raw, normalized = list(raw), list(normalized)
        self._raw = _alternation(raw)
        self._normalized = _alternation(normalized)
        self.lookahead = max(map(len, raw), default=0) + max(map(len, normalized), default=0)

    def split(self, text: str) -> list[str]:
        """``[text, token, text, ..., text]`` (a text piece may be empty)."""
        pieces = self._raw.split(text) if self._raw is not None else [text]
        second = self._normalized
        if second is None:
            return pieces
        out: list[str] = []
        for index, piece in enumerate(pieces):
            out.extend(second.split(piece) if index % 2 == 0 else (piece,))
        return out
