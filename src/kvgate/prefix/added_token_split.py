"""A text split on a tokenizer's added tokens, as the ``tokenizers`` library splits it.

The library splits in two stages: first on the added tokens matched on the raw text
(``normalized=False``), then, in each piece between them, on those matched on the normalised
text (``normalized=True``, e.g. DeepSeek V3's turn and tool-call tokens); each stage takes the leftmost
match and, at one position, the longest token. Where the tokenizer has no normaliser (or an
empty one) the normalised text is the raw text, so both stages match literals, which is all
this does. A regular expression of the tokens, longest first, is leftmost-longest.

``lookahead``: how far past a position the split may look to decide it. A stage decides a
position by the text up to its longest token ahead, and the second stage also by where the
first cut the piece, which is decided up to the first stage's longest token further: the two
maxima added (``kvgate.router.core.reuse`` relies on this).
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _alternation(tokens: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = sorted(tokens, key=len, reverse=True)
    if not alternatives:
        return None
    return re.compile("(" + "|".join(re.escape(a) for a in alternatives) + ")")


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
