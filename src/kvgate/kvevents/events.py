"""The KV cache event types vLLM publishes (``vllm/distributed/kv_events.py``), defined once.

The simulator builds these and encodes them (`kvgate.kvevents.encode`); the directory decodes
payloads into them (`kvgate.kvevents.decode`). Field names and order are vLLM 0.33's.

Defaults are what an absent field decodes to: vLLM's own default where it declares one (every
optional field defaults to None), and None for the three fields vLLM requires but older
releases did not send (`lora_id`, `medium`, `lora_name`). A publisher therefore states what it
publishes: the simulator sets `medium="GPU"`, `group_idx=0` and, on stores,
`kv_cache_spec_kind="full_attention"` as vLLM 0.33 does for a model with one attention group
(its KV cache manager annotates each store with its group's kind).

vLLM 0.33's `BlockStored` also carries `locality`, `ownership`, `session_id` and
`lookahead_token_ids`; kvgate neither sets nor reads them, so they are not modelled here
(the decoder ignores them, the encoder never writes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.prefix import BlockKey, block_key

#: A block hash as published: a digest (32 bytes for SHA-256, 16 for xxh3-128) or, with
#: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the low 64 bits of its big-endian integer.
BlockHash = bytes | int

MEDIUM_GPU = "GPU"
#: vLLM's CPU offloading tier (`--kv-offloading-backend native`, OffloadingConnector events).
MEDIUM_CPU = "CPU"

#: `kv_cache_spec_kind` values (vLLM's `KVCacheSpecKind`) of groups whose layers attend to the
#: whole prefix: a block hit there is a hit for the request. Sliding-window, chunked-local and
#: mamba groups keep only recent state, so their blocks say nothing about a long prefix.
KIND_FULL_ATTENTION = "full_attention"
FULL_ATTENTION_KINDS = frozenset({KIND_FULL_ATTENTION, "mla_attention", "sink_full_attention"})

#: Wire order of each event's fields (vLLM declaration order; the array form uses it too).
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window")  # fmt: skip
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly cached by a pod, chained on `parent_block_hash` (None: from block 0)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # One entry per block: the untagged extra keys (e.g. ``(cache_salt,)`` on block 0) or None.
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None

    @property
    def keys(self) -> list[BlockKey]:
        """The directory's key of each block hash."""
        return directory_keys(self.block_hashes)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks a pod evicted from `medium`."""

    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None

    @property
    def keys(self) -> list[BlockKey]:
        """The directory's key of each block hash."""
        return directory_keys(self.block_hashes)


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The pod dropped its whole prefix cache (``/reset_prefix_cache``)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class RejectedEvent:
    """An event the decoder left out of a batch: `reason` is a short metric label."""

    reason: str  # unknown_type | bad_hash | bad_field | malformed_event | too_many_blocks
    detail: str
    removal: bool = False  # it was a `BlockRemoved`: the blocks it names may still be listed


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One ZMQ payload: vLLM's ``KVEventBatch`` (`rejected` is filled by the decoder only)."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    rejected: list[RejectedEvent] = field(default_factory=list)
    # Events after the decoder's `MAX_REJECTED_EVENTS`-th rejection: neither decoded nor kept.
    unread_events: int = 0

    @property
    def lost_removal(self) -> bool:
        """A removal of this batch was not decoded (rejected, or among the unread events), so
        a block it removed may still be listed: only a clear of the pod is safe."""
        return bool(self.unread_events) or any(r.removal for r in self.rejected)


def directory_keys(hashes: list[BlockHash]) -> list[BlockKey]:
    """Directory keys of hashes (bytes stay as they are; ints become 8 bytes)."""
    if set(map(type, hashes)) <= {bytes}:  # the common case, checked in C
        return hashes  # type: ignore[return-value]  # all bytes: already block keys
    return [block_key(h) for h in hashes]
