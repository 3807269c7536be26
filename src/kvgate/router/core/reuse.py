"""Reuse the token ids and block digests of a recent prompt that shares the new one's prefix.

An agent resends its whole history every turn: the rendered prompt of turn n+1 starts with the
prompt of turn n (minus the generation prompt). Re-tokenizing and re-hashing that prefix costs
more than everything else in a routing decision, even with the tokenizer's segment cache and
the hasher's span cache (both still hash every piece of text and every span of tokens).

Algorithm, for a prompt text and the (salt, LoRA) it is hashed with:

1. Candidates: the last `bucket` prompts hashed with the same salt and LoRA in the same
   session (when the caller knows it), else whose first `head_chars` characters equal this
   one's (an LRU of such buckets, bounded in tokens). The bucket only decides where to look:
   a candidate from another conversation merely shares less.
2. For each, the common prefix length `lcp` in characters (chunked slice comparison, then a
   bisection in the first differing chunk). The usable cut is the last position `b` just after
   an added token of the candidate with `b + max_added_token_chars <= lcp`: the tokenizer's
   split (alternation of literal added tokens) decides a position by looking at most that far
   ahead, so both texts are split identically up to `b` and the candidate's ids up to `b` are
   this prompt's ids (the tokenizer encodes each piece alone: `Tokenizer.encode_tail`).
3. The text after `b` is tokenized (`encode_tail`, segment cache), and the blocks that lie
   wholly in the reused ids keep their digests (a digest depends only on the tokens up to its
   block, the salt and the LoRA); `BlockHasher.hash_blocks(known=...)` hashes the rest.

The result is identical to `tokenizer.encode(text)` and `hasher.hash_blocks(ids)`, which the
tests check on randomised histories. Used only where that holds: a segmented tokenizer, no
special tokens added around the prompt, no truncation (the caller checks the body).

Memory: the prompts kept are bounded in bytes (`max_bytes`: text, ids at 8 bytes each since the
tokenizer's ids are canonical, cut offsets, digests); a prompt over an eighth of the budget is
not kept. Safe for concurrent use: the lock covers only reading a bucket and remembering a
prompt, never the comparison, tokenization or hashing.
"""

from __future__ import annotations

import sys
import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

from kvgate.prefix import BlockHasher, LoraKey, Tokenizer


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str
    ids: tuple[int, ...]
    cut_chars: list[int]  # offsets just after each added token, ascending
    cut_ids: list[int]  # number of ids before each of those offsets
    digests: tuple[bytes, ...]

    @property
    def bytes(self) -> int:
        """What keeping this prompt costs (ids canonical: no int objects of their own)."""
        cuts = len(self.cut_chars)
        return (
            sys.getsizeof(self.text)
            + sys.getsizeof(self.ids)
            + 2 * (56 + cuts * (8 + 32))
            + sys.getsizeof(self.digests)
            + len(self.digests) * (33 + 32)
            + 200
        )


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (bisection on slices: about two
    copies of the shorter string in all, in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


DEFAULT_REUSE_BYTES = 64 << 20


class PromptReuse:
    """Recent prompts' ids and digests, for one tokenizer and one hasher; thread-safe."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        hasher: BlockHasher,
        *,
        max_bytes: int = DEFAULT_REUSE_BYTES,
        head_chars: int = 256,
        bucket: int = 8,
    ) -> None:
        if not tokenizer.segmented:
            raise ValueError("prompt reuse needs a segmented tokenizer")
        self.tokenizer = tokenizer
        self.hasher = hasher
        self.max_bytes = max_bytes
        self.head_chars = head_chars
        self.bucket = bucket
        self._lookahead = tokenizer.max_added_token_chars
        self._buckets: OrderedDict[tuple[object, ...], list[_Prompt]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.reused_tokens = 0
        self.encoded_tokens = 0

    def ids_and_digests(
        self,
        text: str,
        *,
        cache_salt: str | None,
        lora: LoraKey | None,
        session: str | None = None,
        max_tokens: int | None = None,
    ) -> tuple[tuple[int, ...], list[bytes]]:
        """`tokenizer.encode(text, add_special_tokens=False)` and its block digests. Raises
        `PromptTooLong` (before tokenizing what cannot fit) past `max_tokens` ids."""
        head = (
            (cache_salt, lora, "session", session)
            if session is not None
            else (cache_salt, lora, "text", text[: self.head_chars])
        )
        with self._lock:
            candidates = self._buckets.get(head)
            if candidates is not None:
                self._buckets.move_to_end(head)
                candidates = list(candidates)
        base: _Prompt | None = None
        cut = keep = shared = 0
        if candidates is not None:
            for prompt in candidates:
                if not prompt.cut_ids or prompt.cut_ids[-1] <= keep:
                    continue  # cannot beat the best so far
                if (
                    base is not None
                    and prompt.text[shared : shared + 1] != text[shared : shared + 1]
                ):
                    continue  # shares no more than the best: cuts no later
                shared_here = common_prefix(prompt.text, text)
                usable = shared_here - self._lookahead
                at = bisect_right(prompt.cut_chars, usable) - 1
                if at >= 0 and prompt.cut_ids[at] > keep:
                    base, cut, keep = prompt, prompt.cut_chars[at], prompt.cut_ids[at]
                    shared = shared_here
        tail, ends = self.tokenizer.encode_tail(
            text[cut:] if cut else text, max_tokens=max_tokens, known=keep, starts_text=not cut
        )
        cut_chars = [cut + c for c, _ in ends]
        cut_ids = [keep + n for _, n in ends]
        if base is not None:
            at = bisect_right(base.cut_chars, cut)
            cut_chars = base.cut_chars[:at] + cut_chars
            cut_ids = base.cut_ids[:at] + cut_ids
            ids = base.ids[:keep] + tuple(tail)
            known = base.digests[: keep // self.hasher.block_size]
        else:
            ids, known = tuple(tail), ()
        digests = self.hasher.hash_blocks(ids, lora=lora, cache_salt=cache_salt, known=known)
        self._remember(head, _Prompt(text, ids, cut_chars, cut_ids, tuple(digests)), keep)
        return ids, digests

    def _remember(self, head: tuple[object, ...], prompt: _Prompt, reused: int) -> None:
        size = prompt.bytes
        with self._lock:
            self.reused_tokens += reused
            self.encoded_tokens += len(prompt.ids) - reused
            if size > self.max_bytes // 8:
                return
            candidates = self._buckets.setdefault(head, [])
            self._buckets.move_to_end(head)
            candidates.insert(0, prompt)
            self.bytes += size
            while len(candidates) > self.bucket:
                self.bytes -= candidates.pop().bytes
            while self.bytes > self.max_bytes:
                _, oldest = self._buckets.popitem(last=False)
                self.bytes -= sum(p.bytes for p in oldest)
