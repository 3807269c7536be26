"""CacheGroupFilter: which KV cache groups' events count (hybrid models)."""

from __future__ import annotations

from kvgate.directory.cache_groups import CacheGroupFilter
from kvgate.kvevents import BlockRemoved, BlockStored


def stored(group: int | None, kind: str | None) -> BlockStored:
    return BlockStored([b"k" * 32], None, [0] * 16, 16, group_idx=group, kv_cache_spec_kind=kind)


def test_kinds_decide_and_unknown_kinds_fall_back_to_the_configured_group() -> None:
    groups = CacheGroupFilter(0)
    assert groups.accepts(stored(3, "mla_attention"))
    assert not groups.accepts(stored(0, "sliding_window"))  # the kind wins over the group
    assert groups.is_partial_attention(BlockRemoved([b"k" * 32], group_idx=0))
    assert groups.accepts(stored(0, None)) is False  # learned: group 0 is a window
    assert groups.accepts(stored(None, None))  # no group at all: a plain model
    assert not groups.accepts(stored(7, "unknown"))  # says nothing: not the fallback group
    assert CacheGroupFilter(None).accepts(stored(7, None))


def test_at_most_256_group_kinds_are_remembered() -> None:
    groups = CacheGroupFilter(0)
    for g in range(1000):
        groups.accepts(stored(g, "mamba"))
    assert len(groups._kinds) == 256
    assert groups.accepts(BlockRemoved([b"k" * 32], group_idx=0)) is False  # learned
    assert groups.accepts(BlockRemoved([b"k" * 32], group_idx=999)) is False  # not the fallback
