"""AKV cache ops: validation, branched block keys, the directory lookup plan, rolling drop."""

from __future__ import annotations

import random

import pytest

from kvgate.prefix import BlockHasher
from kvgate.prefix.cache_ops import (
    CacheOps,
    CacheOpsError,
    OpHistory,
    completion_segments,
    history_block_keys,
    lookup_plan,
    parse_cache_ops,
    rolling_drop,
)

BS = 16
HASHER = BlockHasher("sha256", BS)


def _session(num_segments: int, seg_tokens: int = 40, seed: int = 1) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    ids = [rng.randrange(100, 30000) for _ in range(num_segments * seg_tokens)]
    ends = [(i + 1) * seg_tokens for i in range(num_segments)]
    return ids, ends


def _keys(ids: list[int], ends: list[int], raw: dict[str, object] | None) -> list[bytes]:
    ops = parse_cache_ops(raw, len(ends))
    history = OpHistory.from_ops(ops, ends) if ops else OpHistory(())
    return history_block_keys(HASHER, ids, history)


def test_no_ops_keys_are_vllm_exact() -> None:
    ids, ends = _session(6)
    assert parse_cache_ops(None, 6) is None
    assert parse_cache_ops({"drop": {}, "reposition": []}, 6) is None
    assert _keys(ids, ends, None) == HASHER.block_keys(ids)
    salted = history_block_keys(HASHER, ids, OpHistory(()), cache_salt="t")
    assert salted == HASHER.block_keys(ids, cache_salt="t")


def test_different_drops_share_the_prefix_only() -> None:
    ids, ends = _session(8)
    plain = _keys(ids, ends, None)
    a = _keys(ids, ends, {"drop": {"4": [1]}})
    b = _keys(ids, ends, {"drop": {"4": [2]}})
    first_op_block = ends[4] // BS  # the block holding the boundary after segment 4
    assert a[:first_op_block] == b[:first_op_block] == plain[:first_op_block]
    # from the op's block on, nothing is shared: not between the sessions, not with no ops
    assert not set(a[first_op_block:]) & set(b[first_op_block:])
    assert not set(a[first_op_block:]) & set(plain)
    repositioned = _keys(ids, ends, {"drop": {"4": [1]}, "reposition": [4]})
    assert repositioned[:first_op_block] == a[:first_op_block]
    assert not set(repositioned[first_op_block:]) & set(a)


def test_next_turn_matches_its_own_history() -> None:
    ids, ends = _session(10)
    turn1_ids, turn1_ends = ids[: ends[6]], ends[:7]
    turn1 = _keys(turn1_ids, turn1_ends, {"drop": {"4": [1]}})
    turn2 = _keys(ids, ends, {"drop": {"4": [1], "8": [3]}})
    # every full block of turn 1 is a block of turn 2: the drop at 4 is resent as it was
    assert turn2[: len(turn1)] == turn1
    # the same request hashed twice gives the same keys
    assert _keys(ids, ends, {"drop": {"4": [1], "8": [3]}}) == turn2


def test_validation_errors() -> None:
    with pytest.raises(CacheOpsError, match="out of range"):
        parse_cache_ops({"drop": {"9": [0]}}, 5)
    with pytest.raises(CacheOpsError, match="after the boundary"):
        parse_cache_ops({"drop": {"1": [3]}}, 5)
    with pytest.raises(CacheOpsError, match="dropped twice"):
        parse_cache_ops({"drop": {"1": [0], "2": [0]}}, 5)
    with pytest.raises(CacheOpsError, match="unknown field"):
        parse_cache_ops({"evict": []}, 5)
    with pytest.raises(CacheOpsError, match="integer"):
        parse_cache_ops({"reposition": [1.5]}, 5)
    with pytest.raises(CacheOpsError, match="not a segment index"):
        parse_cache_ops({"drop": {"-1": [0]}}, 5)
    for key in ("²", "\uff11"):  # digits to str.isdigit(), not plain ASCII digits
        with pytest.raises(CacheOpsError, match="not a segment index"):
            parse_cache_ops({"drop": {key: [0]}}, 5)
    with pytest.raises(CacheOpsError, match="must be an object"):
        parse_cache_ops([1], 5)
    with pytest.raises(CacheOpsError, match="boundary → list"):
        parse_cache_ops({"drop": []}, 5)
    with pytest.raises(CacheOpsError, match="list of boundaries"):
        parse_cache_ops({"reposition": {}}, 5)
    with pytest.raises(CacheOpsError, match="more than"):
        parse_cache_ops({"reposition": list(range(5000))}, 6000)
    ops = parse_cache_ops({"drop": {"1": [0], "2": [1]}, "reposition": [2]}, 3)
    assert ops == CacheOps({1: (0,), 2: (1,)}, frozenset({2}))
    assert ops is not None and ops.to_json() == {"drop": {"1": [0], "2": [1]}, "reposition": [2]}


def test_completion_segments() -> None:
    assert completion_segments([3, 4], 10) == [3, 7, 10]
    assert completion_segments([3, 7], 10) == [3, 10]
    for bad in (None, [], [0], [11], [True]):
        with pytest.raises(CacheOpsError):
            completion_segments(bad, 10)


def test_dropped_blocks_and_positions() -> None:
    # segments of 40 tokens: segment 1 is tokens [40, 80): blocks 3 and 4 lie wholly inside
    history = OpHistory.from_ops(CacheOps({4: (1,)}, frozenset({4})), [40, 80, 120, 160, 200])
    assert history.dropped_blocks(BS) == {3: 200, 4: 200}
    assert history.dropped_before(199) == 0 and history.dropped_before(200) == 40
    assert history.positions(300) == 260


def test_lookup_plan_skips_dropped_blocks_conservatively() -> None:
    ids, ends = _session(8)
    raw = {"drop": {"6": [1]}}
    keys = _keys(ids, ends, raw)
    ops = parse_cache_ops(raw, len(ends))
    assert ops is not None
    history = OpHistory.from_ops(ops, ends)
    plan = lookup_plan(keys, history, BS)
    dropped = history.dropped_blocks(BS)
    assert set(dropped) == {3, 4}
    assert plan.keys == [k for i, k in enumerate(keys) if i not in (3, 4)]
    # holding blocks 0-2: 3 path blocks; holding up to block 16 without blocks 3-4 is only
    # restorable once the drop (at token 280, block 17) is applied: until then, 3 blocks
    op_block = ends[6] // BS
    assert plan.path_blocks[3] == 3
    assert plan.path_blocks[op_block - 2] == 3
    # holding every needed block through the op's block: blocks 3-4 are not needed
    assert plan.path_blocks[op_block - 1] == op_block + 1
    assert plan.path_blocks[len(plan.keys)] == len(keys)


def test_lookup_plan_names_the_dropped_blocks_a_restore_still_needs() -> None:
    ids, ends = _session(8)
    raw: dict[str, object] = {"drop": {"4": [1], "6": [3]}}
    keys = _keys(ids, ends, raw)
    ops = parse_cache_ops(raw, len(ends))
    assert ops is not None
    plan = lookup_plan(keys, OpHistory.from_ops(ops, ends), BS)
    # blocks 3-4 are dropped at token 200 (block 12), blocks 8-9 at token 280 (block 17)
    held = plan.keys.index(keys[17])  # a pod holds every needed block before block 17
    assert plan.path_blocks[held] == 3  # without any dropped block
    assert plan.needed_end[held] == 17  # with the ones whose drop comes after block 16
    assert plan.late_keys(17) == [keys[8], keys[9]]
    assert plan.late_keys(12) == [keys[3], keys[4], keys[8], keys[9]]
    assert plan.late_keys(18) == []
    assert plan.needed_end[len(plan.keys)] == len(keys)


def test_rolling_drop_keeps_the_last_n_tool_responses() -> None:
    tools = [2, 4, 6, 8, 10]
    assert rolling_drop(tools, 12) is None
    ops = rolling_drop(tools, 2)
    assert ops == CacheOps({6: (2,), 8: (4,), 10: (6,)}, frozenset())
    # the next turn extends the ops it sent before
    longer = rolling_drop([*tools, 12], 2)
    assert longer is not None and dict(longer.drop) == {**ops.drop, 12: (8,)}
