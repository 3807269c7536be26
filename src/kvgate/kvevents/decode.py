"""Decode vLLM KV event payloads into `kvgate.kvevents` types.

A payload is msgpack of `KVEventBatch`, encoded as an array `[ts, events, data_parallel_rank]`
(the rank may be absent). Each event is a tagged union member, in one of two encodings:

* map (vLLM 0.33): `{"type": "BlockStored", "block_hashes": [...], ...}`;
* array (older vLLM): `["BlockStored", block_hashes, parent_block_hash, ...]`, fields in
  declaration order (`STORED_FIELDS`, `REMOVED_FIELDS`), trailing default fields omitted.

Required fields: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size` of
`BlockStored` and `block_hashes` of `BlockRemoved`; the others may be absent (None). Fields
kvgate does not model (later vLLM additions) are ignored.

Hashes are bytes (a 32-byte SHA-256 digest, or 16 bytes for vLLM's xxhash algorithms) or
unsigned 64-bit ints; `BlockStored.keys` turns either into the directory's block keys.

Bad input never raises past `decode_batch`: a payload that is not a batch raises
`EventDecodeError` (the caller counts and skips it); a bad event inside a good batch (unknown
type, wrong hash size, wrong field type) is left out and reported in `EventBatch.rejected`, so
the rest of the batch still applies. A batch stops being read at its `MAX_REJECTED_EVENTS`-th
bad event: the events after it are only counted (`EventBatch.unread_events`). Rejecting an
event costs a raised exception, about 1.5 us: a payload of one-byte junk events made a
megabyte cost seconds of the router's event loop and ~150 bytes a rejection. A detail shows a
short form of what the pod sent (`_shown`), never a full repr of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from kvgate.kvevents.events import (
    REMOVED_FIELDS,
    STORED_FIELDS,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    RejectedEvent,
)

#: Byte lengths of hashes vLLM publishes: SHA-256 digests and xxh3-128 digests.
HASH_SIZES = frozenset({32, 16})
_MAX_U64 = (1 << 64) - 1
_FIELDS = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}
#: Bad events of one batch that are reported one by one; the batch is read no further.
MAX_REJECTED_EVENTS = 64


class EventDecodeError(ValueError):
    """The payload is not a KV event batch. `reason` is a short metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class _Reject(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def decode_batch(payload: bytes, *, check_token_ids: bool = True) -> EventBatch:
    """Decode one ZMQ payload. Raises `EventDecodeError` if it is not a KV event batch.

    `check_token_ids=False` skips checking that every token id is an int (the indexer never
    reads them, and they are most of a payload's values); the list itself is still required.
    """
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises a zoo of types for malformed/truncated input
        # msgpack caps declared lengths by the payload size, so "exceeds max_*" is also a
        # payload that ends before what it announced.
        text = str(exc).lower()
        short = any(w in text for w in ("incomplete", "insufficient", "exceeds max_"))
        reason = "truncated" if short else "malformed"
        raise EventDecodeError(reason, f"not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, list) or len(raw) < 2:
        raise EventDecodeError("malformed", "a batch is an array [ts, events, dp_rank]")
    ts, raw_events = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 else None
    if not _is_number(ts) or not isinstance(raw_events, list) or not _is_opt_int(rank):
        raise EventDecodeError("malformed", "a batch is [ts: float, events: list, dp_rank: int]")
    events: list[KVEvent] = []
    rejected: list[RejectedEvent] = []
    for index, raw_event in enumerate(raw_events):
        try:
            events.append(_decode_event(raw_event, check_token_ids))
        except _Reject as exc:
            rejected.append(RejectedEvent(exc.reason, str(exc)))
            if len(rejected) == MAX_REJECTED_EVENTS:
                unread = len(raw_events) - index - 1
                return EventBatch(float(ts), events, rank, rejected, unread_events=unread)
    return EventBatch(ts=float(ts), events=events, data_parallel_rank=rank, rejected=rejected)


def _shown(value: Any) -> str:
    """A pod's value in a rejection's detail, cut short without a full repr of what it sent
    (a repr costs as much as the value is long): containers by their type and length."""
    if isinstance(value, list | dict):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, str | bytes) and len(value) > 40:
        return f"{value[:40]!r}..."
    return repr(value)[:60]


def _decode_event(raw: Any, check_token_ids: bool) -> KVEvent:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, values = raw[0], raw[1:]
        fields: Mapping[str, Any] = dict(zip(_FIELDS.get(tag, ()), values, strict=False))
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], raw
    else:
        raise _Reject(
            "malformed_event", f"an event is a map with 'type' or a tagged array: {_shown(raw)}"
        )
    if tag == "BlockStored":
        return BlockStored(
            block_hashes=_hashes(fields),
            parent_block_hash=_opt_hash(fields.get("parent_block_hash")),
            token_ids=_int_list(fields, "token_ids", check_token_ids),
            block_size=_int(fields, "block_size"),
            lora_id=_opt(fields, "lora_id", int),
            medium=_medium(fields),
            lora_name=_opt(fields, "lora_name", str),
            extra_keys=_extra_keys(fields),
            group_idx=_opt(fields, "group_idx", int),
            kv_cache_spec_kind=_opt(fields, "kv_cache_spec_kind", str),
            kv_cache_spec_sliding_window=_opt(fields, "kv_cache_spec_sliding_window", int),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields),
            medium=_medium(fields),
            group_idx=_opt(fields, "group_idx", int),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise _Reject("unknown_type", f"unknown event type {_shown(tag)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_opt_int(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _check_hash(value: Any) -> BlockHash:
    if isinstance(value, bytes):
        if len(value) not in HASH_SIZES:
            raise _Reject("bad_hash", f"a {len(value)}-byte hash (expected 32 or 16)")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= _MAX_U64:
            raise _Reject("bad_hash", f"integer hash outside 64 bits: {value}")
        return value
    raise _Reject("bad_hash", f"a hash is bytes or int, not {type(value).__name__}")


def _opt_hash(value: Any) -> BlockHash | None:
    return None if value is None else _check_hash(value)


def _hashes(fields: Mapping[str, Any]) -> list[BlockHash]:
    value = fields.get("block_hashes")
    if not isinstance(value, list):
        raise _Reject("bad_field", "block_hashes must be a list")
    if set(map(type, value)) <= {bytes} and set(map(len, value)) <= HASH_SIZES:
        return value  # the common case, checked in C
    return [_check_hash(h) for h in value]


def _int(fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Reject("bad_field", f"{name} must be an int, got {_shown(value)}")
    return value


def _int_list(fields: Mapping[str, Any], name: str, check_items: bool) -> list[int]:
    value = fields.get(name)
    # set(map(type, ...)) runs in C: token lists are long
    if not isinstance(value, list) or (check_items and not set(map(type, value)) <= {int}):
        raise _Reject("bad_field", f"{name} must be a list of ints")
    return value


def _opt(fields: Mapping[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise _Reject("bad_field", f"{name} must be {kind.__name__} or null, got {_shown(value)}")
    return value


def _medium(fields: Mapping[str, Any]) -> str | None:
    medium: str | None = _opt(fields, "medium", str)
    if medium is not None and (not medium or "," in medium):
        raise _Reject("bad_field", f"medium {_shown(medium)} is empty or contains ','")
    return medium


def _extra_keys(fields: Mapping[str, Any]) -> list[tuple[Any, ...] | None] | None:
    value = fields.get("extra_keys")
    if value is None:
        return None
    if not isinstance(value, list) or not set(map(type, value)) <= {list, type(None)}:
        raise _Reject("bad_field", "extra_keys must be a list of arrays or nulls")
    return [None if keys is None else tuple(keys) for keys in value]


def event_to_json(event: KVEvent) -> dict[str, Any]:
    """The JSON form `kvgate events decode` prints: bytes hashes as hex, int hashes as ints."""

    def show(h: BlockHash | None) -> str | int | None:
        return h.hex() if isinstance(h, bytes) else h

    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [show(h) for h in event.block_hashes],
            "parent_block_hash": show(event.parent_block_hash),
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_name": event.lora_name,
            "medium": event.medium,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [show(h) for h in event.block_hashes],
            "medium": event.medium,
        }
    return {"type": "AllBlocksCleared"}
