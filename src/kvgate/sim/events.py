"""KV cache events and their wire encoding, byte for byte as vLLM 0.33 publishes them.

vLLM (``vllm/distributed/kv_events.py``) encodes with msgspec:

- a batch is an array-like struct ``[ts, events, data_parallel_rank]``;
- each event is a tagged struct encoded as a map whose first key is ``"type"`` (the class name),
  followed by the fields in declaration order; fields whose value equals their declared default
  are omitted (``omit_defaults``), fields without a default are always present (even ``None``);
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
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    # One entry per block: the untagged extra keys (e.g. ``(cache_salt,)`` on block 0) or None.
    extra_keys: list[tuple[Any, ...] | None]


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[bytes]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def external_hash(digest: bytes, int_hashes: bool) -> ExternalHash:
    """The hash as vLLM publishes it (``maybe_convert_block_hash``)."""
    if not int_hashes:
        return digest
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def _event_map(event: KVEvent, int_hashes: bool) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return {
            "type": "BlockStored",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "parent_block_hash": None if parent is None else external_hash(parent, int_hashes),
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM_GPU,
            "lora_name": None,
            "extra_keys": event.extra_keys,
            "group_idx": 0,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "medium": MEDIUM_GPU,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def encode_batch(
    ts: float, events: list[KVEvent], data_parallel_rank: int = 0, int_hashes: bool = False
) -> bytes:
    """msgpack bytes of a ``KVEventBatch`` as vLLM's publisher sends them."""
    body = [ts, [_event_map(e, int_hashes) for e in events], data_parallel_rank]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed
