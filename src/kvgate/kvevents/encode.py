"""Encode KV event batches byte for byte as vLLM publishes them.

vLLM (``vllm/distributed/kv_events.py``) encodes with msgspec:

- a batch is an array-like struct ``[ts, events, data_parallel_rank]`` (always three items:
  msgspec does not omit trailing defaults of array-like structs);
- vLLM 0.33 encodes each event as a map whose first key is ``"type"`` (the class name),
  followed by the fields in declaration order; fields whose value equals their declared default
  are omitted (``omit_defaults``), fields without a default (``lora_id``, ``medium``,
  ``lora_name`` of ``BlockStored``; ``medium`` of ``BlockRemoved``) are always present, even
  ``None``. msgspec sizes a struct's map header for all its possible entries, so
  ``BlockStored`` (15 fields and the tag) always has a map16 header;
- older releases (0.10) encode an event as an array ``[tag, *fields]`` whose trailing default
  fields are omitted; there only ``block_hashes`` .. ``lora_id`` (``BlockStored``) and
  ``block_hashes`` (``BlockRemoved``) are required (`tagged_arrays=True`);
- block hashes are msgpack ``bin`` or, with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the low
  64 bits of the big-endian integer (`int_hashes=True` converts digests as vLLM does).

We build the same maps with plain ``msgpack`` (``use_bin_type=True``, doubles for floats), so the
bytes are identical; tests decode them with vLLM's own classes to prove it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from kvgate.kvevents.events import (
    REMOVED_FIELDS,
    STORED_FIELDS,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
)

#: Fields vLLM 0.33 declares without a default: always encoded, even when None.
_ALWAYS = {"BlockStored": 7, "BlockRemoved": 2}  # leading fields of STORED/REMOVED_FIELDS
#: Leading fields vLLM 0.10 (array-tagged events) declares without a default.
_ALWAYS_LEGACY = {"BlockStored": 5, "BlockRemoved": 1}
_MASK64 = (1 << 64) - 1


def external_hash(digest: BlockHash, int_hashes: bool) -> BlockHash:
    """The hash as vLLM publishes it (``maybe_convert_block_hash``); ints pass through."""
    if not int_hashes or isinstance(digest, int):
        return digest
    return int.from_bytes(digest, "big") & _MASK64


def _fields(event: KVEvent, int_hashes: bool) -> tuple[str, list[tuple[str, Any]]]:
    """The event's tag and its ``(name, wire value)`` pairs in wire order."""
    names: tuple[str, ...]
    if isinstance(event, BlockStored):
        tag, names = "BlockStored", STORED_FIELDS
    elif isinstance(event, BlockRemoved):
        tag, names = "BlockRemoved", REMOVED_FIELDS
    else:
        return "AllBlocksCleared", []
    pairs = [(n, getattr(event, n)) for n in names]
    if int_hashes:
        pairs = [
            (n, _convert(n, v)) if n in ("block_hashes", "parent_block_hash") else (n, v)
            for n, v in pairs
        ]
    return tag, pairs


def _convert(name: str, value: Any) -> Any:
    if name == "block_hashes":
        return [external_hash(h, True) for h in value]
    return None if value is None else external_hash(value, True)


def _pack_map_event(event: KVEvent, int_hashes: bool) -> bytes:
    tag, pairs = _fields(event, int_hashes)
    always = _ALWAYS.get(tag, 0)
    entries = [("type", tag)]
    entries += [(n, v) for i, (n, v) in enumerate(pairs) if i < always or v is not None]
    if tag != "BlockStored":
        packed: bytes = msgpack.packb(dict(entries), use_bin_type=True)
        return packed
    # vLLM's BlockStored has 15 fields plus the tag: msgspec sizes the map header for the most
    # entries the struct can have, so the header is always map16, however many are omitted.
    parts = [b"\xde", len(entries).to_bytes(2, "big")]
    for key, value in entries:
        parts.append(msgpack.packb(key, use_bin_type=True))
        parts.append(msgpack.packb(value, use_bin_type=True))
    return b"".join(parts)


def _pack_array_event(event: KVEvent, int_hashes: bool) -> bytes:
    tag, pairs = _fields(event, int_hashes)
    values = [v for _n, v in pairs]
    always = _ALWAYS_LEGACY.get(tag, 0)
    while len(values) > always and values[-1] is None:  # omit_defaults: trailing Nones go
        values.pop()
    packed: bytes = msgpack.packb([tag, *values], use_bin_type=True)
    return packed


def encode_batch(
    batch: EventBatch, *, int_hashes: bool = False, tagged_arrays: bool = False
) -> bytes:
    """msgpack bytes of a ``KVEventBatch`` as vLLM's publisher sends them.

    Map-tagged events as vLLM 0.33, or array-tagged as older releases with `tagged_arrays`.
    The inverse of `kvgate.kvevents.decode_batch` (``batch.rejected`` is not encoded).
    """
    pack = _pack_array_event if tagged_arrays else _pack_map_event
    events_header: bytes = msgpack.Packer().pack_array_header(len(batch.events))
    return b"".join(
        (
            b"\x93",  # array of 3: [ts, events, data_parallel_rank]
            msgpack.packb(float(batch.ts)),
            events_header,
            *(pack(e, int_hashes) for e in batch.events),
            msgpack.packb(batch.data_parallel_rank),
        )
    )
