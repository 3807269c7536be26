"""KV cache events and their wire encoding, byte for byte as vLLM 0.33 publishes them.

vLLM (``vllm/distributed/kv_events.py``) encodes with msgspec:

- a batch is an array-like struct ``[ts, events, data_parallel_rank]``;
- each event is a tagged struct encoded as a map whose first key is ``"type"`` (the class name),
  followed by the fields in declaration order; fields whose value equals their declared default
  are omitted (``omit_defaults``), fields without a default are always present (even ``None``);
  msgspec sizes a struct's map header for all its possible entries, so ``BlockStored`` (15
  fields and the tag) always has a map16 header;
- block hashes are the 32-byte digests as msgpack ``bin`` or, with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the low 64 bits of the big-endian integer.

We build the same maps with plain ``msgpack`` (``use_bin_type=True``, doubles for floats), so the
bytes are identical; tests decode them with vLLM's own classes to prove it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"

ExternalHash = bytes | int


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly cached. Field order and defaults are vLLM's ``BlockStored``."""

    block_hashes: list[ExternalHash]
    parent_block_hash: ExternalHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None  # no default in vLLM: always encoded
    medium: str | None = MEDIUM_GPU  # no default in vLLM: always encoded
    lora_name: str | None = None  # no default in vLLM: always encoded
    # One entry per block: the untagged extra keys (e.g. ``(cache_salt,)`` on block 0) or None.
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = 0
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[ExternalHash]
    medium: str | None = MEDIUM_GPU  # no default in vLLM: always encoded
    group_idx: int | None = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def external_hash(digest: ExternalHash, int_hashes: bool) -> ExternalHash:
    """The hash as vLLM publishes it (``maybe_convert_block_hash``); ints pass through."""
    if not int_hashes or isinstance(digest, int):
        return digest
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def _event_map(event: KVEvent, int_hashes: bool) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        out: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "parent_block_hash": None if parent is None else external_hash(parent, int_hashes),
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
        optional: tuple[tuple[str, Any], ...] = (
            ("extra_keys", event.extra_keys),
            ("group_idx", event.group_idx),
            ("kv_cache_spec_kind", event.kv_cache_spec_kind),
            ("kv_cache_spec_sliding_window", event.kv_cache_spec_sliding_window),
        )
    elif isinstance(event, BlockRemoved):
        out = {
            "type": "BlockRemoved",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "medium": event.medium,
        }
        optional = (("group_idx", event.group_idx),)
    else:
        return {"type": "AllBlocksCleared"}
    for key, value in optional:  # msgspec's omit_defaults: these default to None
        if value is not None:
            out[key] = value
    return out


def _pack_event(event: KVEvent, int_hashes: bool) -> bytes:
    fields = _event_map(event, int_hashes)
    if not isinstance(event, BlockStored):
        packed: bytes = msgpack.packb(fields, use_bin_type=True)
        return packed
    # vLLM's BlockStored has 15 fields plus the tag: msgspec sizes the map header for the most
    # entries the struct can have, so the header is always map16, however many are omitted.
    parts = [b"\xde", len(fields).to_bytes(2, "big")]
    for key, value in fields.items():
        parts.append(msgpack.packb(key, use_bin_type=True))
        parts.append(msgpack.packb(value, use_bin_type=True))
    return b"".join(parts)


def encode_batch(
    ts: float, events: list[KVEvent], data_parallel_rank: int | None = 0, int_hashes: bool = False
) -> bytes:
    """msgpack bytes of a ``KVEventBatch`` as vLLM's publisher sends them."""
    events_header: bytes = msgpack.Packer().pack_array_header(len(events))
    return b"".join(
        (
            b"\x93",  # array of 3: [ts, events, data_parallel_rank]
            msgpack.packb(float(ts)),
            events_header,
            *(_pack_event(e, int_hashes) for e in events),
            msgpack.packb(data_parallel_rank),
        )
    )
