"""AKV-style cache ops: a request's `cache` field, and block keys that carry the op history.

The client resends its whole history (each message an implicit append) plus an optional field

    "cache": {"drop": {"<i>": [j, ...]}, "reposition": [i, ...]}

meaning: after segment *i* (a chat message; for `/v1/completions`, a run of `segments[i]`
prompt tokens), drop the KV of segments *j* (each j ≤ i, each dropped once), then renumber the
remaining positions 0 … r-1 (reposition) so that the next append continues at r. At one boundary
the drop applies before the reposition.

Keys. A drop or reposition changes the KV of everything after it, so the op history is part of
the key: block *k* is hashed as vLLM hashes it, `hash((parent, tokens, extra_keys))`, with one
record per op whose token offset *t* falls in the block (`k = t // block_size`) appended to its
extra keys:

    ("akv", t, ((start, end), ...) dropped token ranges, reposition: bool)

Blocks before the first op keep vLLM's exact keys (the shared prefix); the chain carries every
op on, so two sessions whose drops differ never share a key past the first difference, and a
session's next turn, which resends the same ops, matches its own history exactly. A request
with no ops is hashed exactly as vLLM hashes it.

Restorable prefixes. A dropped block (one wholly inside a dropped range) is not needed once
its drop has been applied: a server may evict it while keeping the blocks after the drop. The
first *c* blocks can be restored when every block before *c* is held or was dropped by an op at
an offset ≤ c·block_size (`lookup_plan`). A session's latest drop usually lies in the block
after its held history (the tokens after the boundary change from turn to turn), so its dropped
blocks are still needed there: a pod that evicted older dropped blocks can restore the whole
held history only while it holds those.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.prefix.completion_prompt import PromptError
from kvgate.prefix.hashing import (
    INT_KEY_SIZE,
    BlockHasher,
    BlockKey,
    LoraKey,
    extra_keys_for_block,
    hash_block,
)

#: Distinct boundaries (drop keys and repositions) one request may name.
MAX_BOUNDARIES = 4096
AKV_TAG = "akv"


class CacheOpsError(PromptError):
    """A malformed `cache` field (a 400 with `param="cache"`)."""


@dataclass(frozen=True, slots=True)
class CacheOps:
    """Validated ops in segment terms: boundary → dropped segments, and reposition boundaries."""

    drop: Mapping[int, tuple[int, ...]]
    reposition: frozenset[int]

    @property
    def boundaries(self) -> list[int]:
        return sorted(set(self.drop) | self.reposition)

    def needed_ends(self) -> set[int]:
        """Segments whose end offset the token history needs."""
        ends = set(self.boundaries)
        for dropped in self.drop.values():
            for j in dropped:
                ends.add(j)
                if j:
                    ends.add(j - 1)
        return ends

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.drop:
            out["drop"] = {str(i): list(js) for i, js in sorted(self.drop.items())}
        if self.reposition:
            out["reposition"] = sorted(self.reposition)
        return out


def _index(value: Any, what: str, num_segments: int) -> int:
    if isinstance(value, str):
        # ASCII only: str.isdigit() also accepts digits int() refuses ("²")
        if not (value.isascii() and value.isdigit()) or len(value) > 9:
            raise CacheOpsError(f"`cache`: {what} {value[:16]!r} is not a segment index")
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CacheOpsError(f"`cache`: {what} must be an integer, got {type(value).__name__}")
    if not 0 <= value < num_segments:
        raise CacheOpsError(
            f"`cache`: {what} {value} is out of range: the request has {num_segments} "
            "messages (segments)"
        )
    return value


def parse_cache_ops(raw: Any, num_segments: int) -> CacheOps | None:
    """The `cache` field of a request with `num_segments` messages (or segments), validated;
    None when absent or empty. Raises CacheOpsError with a message for the client."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise CacheOpsError("`cache` must be an object with `drop` and/or `reposition`")
    unknown = set(raw) - {"drop", "reposition", "segments"}
    if unknown:
        raise CacheOpsError(f"`cache`: unknown field(s) {sorted(unknown)}")
    raw_drop = raw.get("drop")
    raw_repo = raw.get("reposition")
    raw_drop = {} if raw_drop is None else raw_drop
    raw_repo = [] if raw_repo is None else raw_repo
    if not isinstance(raw_drop, Mapping):
        raise CacheOpsError("`cache.drop` must be an object: boundary → list of segments")
    if not isinstance(raw_repo, list):
        raise CacheOpsError("`cache.reposition` must be a list of boundaries")
    if len(raw_drop) + len(raw_repo) > MAX_BOUNDARIES:
        raise CacheOpsError(f"`cache` names more than {MAX_BOUNDARIES} boundaries")
    drop: dict[int, tuple[int, ...]] = {}
    dropped: set[int] = set()
    for key, targets in raw_drop.items():
        boundary = _index(key, "drop boundary", num_segments)
        if boundary in drop:
            raise CacheOpsError(f"`cache.drop`: boundary {boundary} given twice")
        if not isinstance(targets, list) or not targets:
            raise CacheOpsError(f"`cache.drop[{boundary}]` must be a non-empty list")
        if len(targets) > num_segments:
            raise CacheOpsError(f"`cache.drop[{boundary}]` names more segments than exist")
        js = []
        for target in targets:
            j = _index(target, f"segment dropped at {boundary}", num_segments)
            if j > boundary:
                raise CacheOpsError(
                    f"`cache.drop[{boundary}]`: segment {j} comes after the boundary"
                )
            if j in dropped:
                raise CacheOpsError(f"`cache.drop`: segment {j} is dropped twice")
            dropped.add(j)
            js.append(j)
        drop[boundary] = tuple(sorted(js))
    repo: set[int] = set()
    for value in raw_repo:
        boundary = _index(value, "reposition boundary", num_segments)
        if boundary in repo:
            raise CacheOpsError(f"`cache.reposition`: boundary {boundary} given twice")
        repo.add(boundary)
    if not drop and not repo:
        return None
    return CacheOps(drop, frozenset(repo))


def completion_segments(raw: Any, num_tokens: int) -> list[int]:
    """End offsets of the segments of a token prompt (`cache.segments`: token counts; what
    they do not cover is one last segment). Raises CacheOpsError."""
    if not isinstance(raw, list) or not raw:
        raise CacheOpsError(
            "`cache.segments` (a list of token counts) is required with ops on /v1/completions"
        )
    if len(raw) > num_tokens:
        raise CacheOpsError("`cache.segments` has more segments than the prompt has tokens")
    ends: list[int] = []
    total = 0
    for n in raw:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise CacheOpsError("`cache.segments` must hold positive integers")
        total += n
        ends.append(total)
    if total > num_tokens:
        raise CacheOpsError(f"`cache.segments` covers {total} tokens; the prompt has {num_tokens}")
    if total < num_tokens:
        ends.append(num_tokens)
    return ends


def token_prompt_history(raw: Any, num_tokens: int) -> OpHistory | None:
    """The `cache` field of a token prompt (`/v1/completions`) in token terms: its
    `segments`, then its ops; None when it names no op. Raises CacheOpsError."""
    if not isinstance(raw, Mapping):
        raise CacheOpsError("`cache` must be an object with `drop` and/or `reposition`")
    ends = completion_segments(raw.get("segments"), num_tokens)
    ops = parse_cache_ops(raw, len(ends))
    return None if ops is None else OpHistory.from_ops(ops, ends)


@dataclass(frozen=True, slots=True)
class OpPoint:
    """One boundary's ops in token terms."""

    offset: int  # tokens before the boundary
    dropped: tuple[tuple[int, int], ...]  # token ranges [start, end) whose KV is dropped
    reposition: bool

    def record(self) -> tuple[Any, ...]:
        return (AKV_TAG, self.offset, self.dropped, self.reposition)


@dataclass(frozen=True, slots=True)
class OpHistory:
    """A request's ops in token terms, sorted by offset."""

    points: tuple[OpPoint, ...]
    # offsets of the points, and the tokens dropped by the first k points (k = 0 … len)
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _dropped_upto: tuple[int, ...] = field(init=False, repr=False, compare=False)
    reposition_offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        totals = [0]
        for point in self.points:
            totals.append(totals[-1] + sum(end - start for start, end in point.dropped))
        object.__setattr__(self, "_offsets", tuple(p.offset for p in self.points))
        object.__setattr__(self, "_dropped_upto", tuple(totals))
        repositions = tuple(p.offset for p in self.points if p.reposition)
        object.__setattr__(self, "reposition_offsets", repositions)

    def repositions_in(self, start: int, end: int) -> tuple[int, ...]:
        """Offsets of the repositions in (start, end]."""
        offsets = self.reposition_offsets
        lo = bisect.bisect_right(offsets, start)
        return offsets[lo : bisect.bisect_right(offsets, end, lo)]

    @classmethod
    def from_ops(cls, ops: CacheOps, segment_ends: Mapping[int, int] | Sequence[int]) -> OpHistory:
        """`segment_ends[i]`: the token offset where segment i ends (every index of
        `ops.needed_ends()` present)."""
        points = []
        for boundary in ops.boundaries:
            ranges = tuple(
                (segment_ends[j - 1] if j else 0, segment_ends[j])
                for j in ops.drop.get(boundary, ())
            )
            ranges = tuple(r for r in ranges if r[1] > r[0])
            points.append(OpPoint(segment_ends[boundary], ranges, boundary in ops.reposition))
        return cls(tuple(sorted(points, key=lambda p: p.offset)))

    def records_by_block(self, block_size: int) -> dict[int, tuple[tuple[Any, ...], ...]]:
        """Block index → the op records hashed into that block's extra keys."""
        out: dict[int, list[tuple[Any, ...]]] = {}
        for point in self.points:
            out.setdefault(point.offset // block_size, []).append(point.record())
        return {k: tuple(v) for k, v in out.items()}

    def dropped_blocks(self, block_size: int) -> dict[int, int]:
        """Block index → offset of the op that drops it, for blocks wholly inside a dropped
        range."""
        out: dict[int, int] = {}
        for point in self.points:
            for start, end in point.dropped:
                for k in range(-(-start // block_size), end // block_size):
                    out[k] = point.offset
        return out

    def dropped_before(self, position: int) -> int:
        """Tokens dropped by ops at offsets ≤ `position` (what attention no longer reads)."""
        return self._dropped_upto[bisect.bisect_right(self._offsets, position)]

    def positions(self, num_tokens: int) -> int:
        """The position the next token gets: repositions renumber what is left."""
        if not self.reposition_offsets:
            return num_tokens
        return num_tokens - self.dropped_before(self.reposition_offsets[-1])


def block_extra_keys(
    block_index: int,
    lora: LoraKey | None,
    cache_salt: str | None,
    records: Mapping[int, tuple[tuple[Any, ...], ...]],
) -> tuple[Any, ...] | None:
    """vLLM's extra keys of a block, followed by the block's op records."""
    base = extra_keys_for_block(block_index, lora, cache_salt)
    ops = records.get(block_index)
    if not ops:
        return base
    return (*(base or ()), *ops)


def history_block_keys(
    hasher: BlockHasher,
    token_ids: Sequence[int],
    history: OpHistory,
    *,
    lora: LoraKey | None = None,
    cache_salt: str | None = None,
    int_form: bool = False,
) -> list[BlockKey]:
    """Keys of every full block of a prompt with op `history` (see the module doc): vLLM's
    keys up to the first op's block, then a branch that carries the ops."""
    size = hasher.block_size
    records = history.records_by_block(size)
    num_blocks = len(token_ids) // size
    first = min(records, default=num_blocks)
    if first >= num_blocks:
        return hasher.block_keys(token_ids, lora=lora, cache_salt=cache_salt, int_form=int_form)
    digests = hasher.hash_blocks(token_ids[: first * size], lora=lora, cache_salt=cache_salt)
    parent = digests[-1] if digests else hasher.none_hash
    for k in range(first, num_blocks):
        extra = block_extra_keys(k, lora, cache_salt, records)
        parent = hash_block(hasher.algo, parent, token_ids[k * size : (k + 1) * size], extra)
        digests.append(parent)
    if int_form:
        return [digest[-INT_KEY_SIZE:] for digest in digests]
    return digests


@dataclass(frozen=True, slots=True)
class LookupPlan:
    """What a router asks the directory for a request with drops. `keys`: the keys of the
    blocks its final state needs. For a pod holding the first n of them, `path_blocks[n]`
    leading path blocks are restorable without any dropped block, and `needed_end[n]` (the
    path blocks before the next needed block) if the pod also holds `late_keys(needed_end[n])`."""

    keys: list[BlockKey]
    path_blocks: list[int]
    needed_end: list[int]
    path_keys: Sequence[BlockKey] = field(repr=False)
    dropped: Mapping[int, int] = field(repr=False)  # dropped path block -> offset of its drop
    block_size: int

    def late_keys(self, blocks: int) -> list[BlockKey]:
        """Keys of the dropped blocks among the first `blocks` whose drop comes after them
        (a restore of `blocks` path blocks needs them), in path order."""
        limit = blocks * self.block_size
        late = sorted(k for k, at in self.dropped.items() if k < blocks and at > limit)
        return [self.path_keys[k] for k in late]


def lookup_plan(keys: Sequence[BlockKey], history: OpHistory, block_size: int) -> LookupPlan:
    """Skip the blocks dropped within the path; map a held count back to path blocks,
    conservatively (a dropped block may be missing until its drop is applied)."""
    num_blocks = len(keys)
    dropped = {
        k: at
        for k, at in history.dropped_blocks(block_size).items()
        if at <= num_blocks * block_size
    }
    kept = [k for k in range(num_blocks) if k not in dropped]
    # valid[c]: the first c blocks can be restored without the dropped ones.
    last_valid = [0] * (num_blocks + 1)
    worst = -1  # the latest op offset among dropped blocks before c
    for c in range(1, num_blocks + 1):
        at = dropped.get(c - 1)
        if at is not None and at > worst:
            worst = at
        last_valid[c] = c if worst <= c * block_size else last_valid[c - 1]
    path_blocks = [0] + [last_valid[k + 1] for k in kept]
    return LookupPlan(
        [keys[k] for k in kept], path_blocks, [*kept, num_blocks], keys, dropped, block_size
    )


def rolling_drop(tool_segments: Sequence[int], keep: int) -> CacheOps | None:
    """Keep the `keep` most recent tool responses: at each newer one, drop the oldest kept.
    The same history always gives the same ops, so each turn extends the previous turn's."""
    drop = {tool_segments[k]: (tool_segments[k - keep],) for k in range(keep, len(tool_segments))}
    return CacheOps(drop, frozenset()) if drop else None
