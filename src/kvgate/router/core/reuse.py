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
"""

from __future__ import annotations

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


class PromptReuse:
    """Recent prompts' ids and digests, for one tokenizer and one hasher. Not thread-safe."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        hasher: BlockHasher,
        *,
        max_tokens: int = 2 << 20,
        head_chars: int = 256,
        bucket: int = 8,
    ) -> None:
        if not tokenizer.segmented:
            raise ValueError("prompt reuse needs a segmented tokenizer")
        self.tokenizer = tokenizer
        self.hasher = hasher
        self.max_tokens = max_tokens
        self.head_chars = head_chars
        self.bucket = bucket
        self._lookahead = tokenizer.max_added_token_chars
        self._buckets: OrderedDict[tuple[object, ...], list[_Prompt]] = OrderedDict()
        self._tokens = 0
        self.reused_tokens = 0
        self.encoded_tokens = 0

    def ids_and_digests(
        self,
        text: str,
        *,
        cache_salt: str | None,
        lora: LoraKey | None,
        session: str | None = None,
    ) -> tuple[tuple[int, ...], list[bytes]]:
        """`tokenizer.encode(text, add_special_tokens=False)` and its block digests."""
        head = (
            (cache_salt, lora, "session", session)
            if session is not None
            else (cache_salt, lora, "text", text[: self.head_chars])
        )
        candidates = self._buckets.get(head)
        base: _Prompt | None = None
        cut = keep = shared = 0
        if candidates is not None:
            self._buckets.move_to_end(head)
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
        tail, ends = self.tokenizer.encode_tail(text[cut:] if cut else text)
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
        self.reused_tokens += keep
        self.encoded_tokens += len(tail)
        self._remember(head, _Prompt(text, ids, cut_chars, cut_ids, tuple(digests)))
        return ids, digests

    def _remember(self, head: tuple[object, ...], prompt: _Prompt) -> None:
        if len(prompt.ids) > self.max_tokens:
            return
        candidates = self._buckets.setdefault(head, [])
        self._buckets.move_to_end(head)
        candidates.insert(0, prompt)
        self._tokens += len(prompt.ids)
        while len(candidates) > self.bucket:
            self._tokens -= len(candidates.pop().ids)
        while self._tokens > self.max_tokens:
            _, oldest = self._buckets.popitem(last=False)
            self._tokens -= sum(len(p.ids) for p in oldest)
