"""Count the tokens of a long text in bounded memory, to refuse it before tokenizing it whole.

Tokenizing costs the ``tokenizers`` library 170-300 bytes of transient memory per character
(normalisation alignments, pre-token splits, one ``String`` per token), so a 16 MB prompt
needs gigabytes. To decide that a text is over a limit, ``at_least`` tokenizes it in chunks of
about ``CHUNK_CHARS`` characters, one at a time, and stops as soon as the count proves it.

Cuts are placed just before a space that sits between two letters (``"…word| next…"``): every
pre-tokenizer in use (the GPT-2, cl100k/Llama 3 and Qwen regexes, Metaspace, whitespace
splits) ends a pre-token there and starts the next one with the space, and no token spans
two pre-tokens, so the chunks' counts add up to the text's. As a safety margin against a
tokenizer that behaves otherwise, each such cut is allowed to lose ``SAFE_CUT_SLACK`` tokens;
where no such position exists within a quarter chunk (a text without spaces) the cut is made
anyway and allowed ``BLIND_CUT_SLACK`` tokens. The result is a lower bound: the caller refuses
only what is certainly over the limit and tokenizes whole (exact ids) whatever might fit.
"""

from __future__ import annotations

import re
from typing import Any

CHUNK_CHARS = 1 << 18
WHOLE_CHARS_MAX = 1 << 20
SAFE_CUT_SLACK = 16
BLIND_CUT_SLACK = 256
#: A space between two letters (or numbers): where the pre-tokenizers in use start a pre-token.
#: Written to start with the space (its lookbehind covers it) so that the engine jumps from
#: space to space: 8-30x faster on text with few such spaces (a long tool output of numbers,
#: code, base64), where the search ran over every character holding the GIL.
LETTER_SPACE_LETTER = re.compile(r" (?<=[^\W\d_] )(?=[^\W\d_])")


def count_first_above(limit: int) -> int:
    """Texts longer than this are counted in chunks before being tokenized whole: up to twice
    the limit in characters (a text that may well fit is tokenized once), at least one chunk,
    at most ``WHOLE_CHARS_MAX`` (what one whole tokenization may hold in transient memory)."""
    return max(CHUNK_CHARS, min(2 * limit, WHOLE_CHARS_MAX))


def cut_positions(text: str, chunk_chars: int = CHUNK_CHARS) -> list[tuple[int, bool]]:
    """Where to cut ``text`` into chunks of about ``chunk_chars`` characters: (offset, whether
    the cut is at a letter-space-letter position)."""
    cuts: list[tuple[int, bool]] = []
    position = chunk_chars
    while position < len(text):
        found = LETTER_SPACE_LETTER.search(
            text, position, min(len(text), position + chunk_chars // 4)
        )
        if found is not None:
            cuts.append((found.start(), True))
        else:
            cuts.append((position, False))
        position = cuts[-1][0] + chunk_chars
    return cuts


def at_least(
    backend: Any,
    text: str,
    limit: int,
    known: int = 0,
    *,
    chunk_chars: int = CHUNK_CHARS,
) -> int:
    """A lower bound on ``known`` plus the tokens of ``text``; it stops counting once the
    bound exceeds ``limit``. ``backend`` is a ``tokenizers.Tokenizer``."""
    cuts = cut_positions(text, chunk_chars)
    total = known
    slack = 0
    start = 0
    for index, (end, safe) in enumerate([*cuts, (len(text), True)]):
        [encoding] = backend.encode_batch_fast([text[start:end]], add_special_tokens=False)
        total += len(encoding)
        del encoding  # free the chunk's transient memory before the next one
        if index < len(cuts):
            slack += SAFE_CUT_SLACK if safe else BLIND_CUT_SLACK
        if total - slack > limit:
            break
        start = end
    return total - slack
