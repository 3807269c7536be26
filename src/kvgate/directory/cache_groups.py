"""Which KV cache group's events describe prefix hits (hybrid models).

A hybrid model (sliding-window + full attention, or mamba + attention layers) has several KV
cache groups in vLLM, and each group publishes its own `BlockStored` / `BlockRemoved` with its
`group_idx`. Only a group of full-attention layers (`FULL_ATTENTION_KINDS`) holds the whole
prefix: a sliding-window group drops blocks that fell out of its window while the request still
hits, and a mamba group keeps one state per request. Counting their blocks would overstate hits
(or lose them on their removals), so only full-attention groups count.

vLLM 0.33 states each store's `kv_cache_spec_kind`; removals carry only `group_idx`, so the
kind of each group is learned from its stores. Events of a group whose kind is unknown (older
vLLM, or a removal before any store) fall back to `fallback_group` (the configured
`kv_cache_group`, 0 by default: vLLM's single group of a plain model); `None` accepts every
group.
"""

from __future__ import annotations

from kvgate.kvevents import FULL_ATTENTION_KINDS, BlockRemoved, BlockStored

_MAX_GROUPS = 256  # group_idx comes from the pod: remember the kinds of this many at most
_UNKNOWN = "unknown"  # vLLM's KVCacheSpecKind.UNKNOWN says nothing either


class CacheGroupFilter:
    """Per pod: does an event's group count? (`accepts`; the kinds it learns are kept)."""

    __slots__ = ("_fallback", "_kinds")

    def __init__(self, fallback_group: int | None = 0) -> None:
        self._fallback = fallback_group
        self._kinds: dict[int, str] = {}

    def accepts(self, event: BlockStored | BlockRemoved) -> bool:
        group = event.group_idx
        kind = event.kv_cache_spec_kind if isinstance(event, BlockStored) else None
        if group is not None:
            if kind is not None and kind != _UNKNOWN:
                if group in self._kinds or len(self._kinds) < _MAX_GROUPS:
                    self._kinds[group] = kind
            else:
                kind = self._kinds.get(group)
        if kind is not None and kind != _UNKNOWN:
            return kind in FULL_ATTENTION_KINDS
        return self._fallback is None or group in (None, self._fallback)

    def is_partial_attention(self, event: BlockStored | BlockRemoved) -> bool:
        """The event's group is known to be one that does not hold the whole prefix (its
        events are expected and skipped quietly, unlike an unknown other group's)."""
        group = event.group_idx
        kind = event.kv_cache_spec_kind if isinstance(event, BlockStored) else None
        if kind is None and group is not None:
            kind = self._kinds.get(group)
        return kind is not None and kind != _UNKNOWN and kind not in FULL_ATTENTION_KINDS
