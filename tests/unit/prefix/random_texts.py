"""Random texts full of what could make a tokenizer's pieces or parts differ from its whole:
contractions, digit runs, combining marks, NFC pairs, numbers that are not digits, whitespace
runs, CJK and kana, SentencePiece's own space marker, and (now and then) added tokens."""

from __future__ import annotations

import random
from collections.abc import Sequence

WORDS = [
    "hello",
    "world",
    "it's",
    "we'll",
    "Σίσυφος",
    "naïve",
    "cafe\u0301",
    "x",
    "I'D",
    "2024",
    "½",
    "x²",
    "Ⅻ",
    "漢字",
    "ひらがなカタカナ",
    "x漢",
    "добрый",
    "🙂",
    "foo_bar",
    "a.b",
    "--",
    "'s",
    "camelCaseWord",
    "HTTPServer",
    "a/b\n",
    "▁",
    "▁▁under",
]
GLUE = [" ", "  ", "\n", "\n\n", "\t", " \n", "\u00a0", "", ", ", ". ", "'", "\r\n", " 12 ", "_"]


def random_text(
    rng: random.Random, chars: int, specials: Sequence[str], special_rate: float = 0.001
) -> str:
    """About ``chars`` characters of words and glue, an added token after a word at
    ``special_rate``."""
    out: list[str] = []
    total = 0
    while total < chars:
        piece = rng.choice(WORDS) + rng.choice(GLUE if rng.random() < 0.4 else [" "])
        if rng.random() < special_rate:
            piece += rng.choice(specials)
        out.append(piece)
        total += len(piece)
    return "".join(out)
