"""Decode vLLM KV event payloads into `kvgate.kvevents` types.

A payload is msgpack of `KVEventBatch`, encoded as an array `[ts, events, data_parallel_rank]`
(the rank may be absent; vLLM 0.33), or as a map of those fields by name (vLLM's main branch
since dropping `array_like` from `EventBatch`). Each event is a tagged union member, in one of
two encodings:

* map (vLLM 0.33): `{"type": "BlockStored", "block_hashes": [...], ...}`;
* array (older vLLM): `["BlockStored", block_hashes, parent_block_hash, ...]`, fields in
  declaration order (`STORED_FIELDS`, `REMOVED_FIELDS`), trailing default fields omitted.

Required fields: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size` of
`BlockStored` and `block_hashes` of `BlockRemoved`; the others may be absent (None). Fields
kvgate does not model (later vLLM additions) are ignored.

Hashes are bytes (a 32-byte SHA-256 digest, or 16 bytes for vLLM's xxhash algorithms) or
unsigned 64-bit ints; `BlockStored.keys` turns either into the directory's block keys.

Bad input never raises past `decode_batch` (or `BatchDecoder.step`): a payload that is not a
batch raises `EventDecodeError` (the caller counts and skips it); a bad event inside a good
batch (unknown type, wrong hash size, wrong field type) is left out and reported in
`EventBatch.rejected`, so the rest of the batch still applies. A batch stops being decoded at
its `MAX_REJECTED_EVENTS`-th bad event: the events after it are only checked as msgpack and
counted (`EventBatch.unread_events`). An event of more than `MAX_EVENT_BLOCKS` block hashes
is rejected (`too_many_blocks`) before they are checked. A rejected `BlockRemoved` is marked
(`RejectedEvent.removal`): its blocks may still be listed, which only a clear undoes. Rejecting an
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
#: Block hashes (and `extra_keys`) of one event: a 1M-token prompt of 16-token blocks cached in
#: one step. An event is checked in one piece, so this bounds that piece (~2 ms); one of
#: 900k int hashes, which an 8 MiB message holds, took 0.6 s of the event loop.
MAX_EVENT_BLOCKS = 1 << 16


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
        self.removal = False  # set where the rejected event is a `BlockRemoved`


def decode_batch(payload: bytes, *, check_token_ids: bool = True) -> EventBatch:
    """Decode one ZMQ payload. Raises `EventDecodeError` if it is not a KV event batch.

    `check_token_ids=False` skips checking that every token id is an int (the indexer never
    reads them, and they are most of a payload's values); the list itself is still required.
    """
    batch = BatchDecoder(payload, check_token_ids=check_token_ids).step()
    assert batch is not None  # a step over the whole payload ends it
    return batch


class BatchDecoder:
    """Decodes one payload a slice at a time: `step(max_bytes)` reads about `max_bytes` more of
    it and returns the batch once the payload is read. msgpack's parser resumes where a slice
    ended, even inside one large value, and events are decoded as they are read, so no slice
    costs more than its bytes: an 8 MiB batch of valid events took ~0.5 s in one piece.
    Nothing is returned before the end, so a payload that turns out bad applies no event.
    """

    def __init__(self, payload: bytes, *, check_token_ids: bool = True) -> None:
        self._payload = memoryview(payload)
        self._check_token_ids = check_token_ids
        self._unpacker = _unpacker(len(payload))
        self._fed = 0
        self._unpacker_start = 0  # where in the payload the unpacker's stream starts
        self._skipping = False  # the unpacker is one that skips the unread events
        self._items: int | None = None  # of the batch array (or map), once its header is read
        self._as_map = False  # the batch is a map {ts, events, data_parallel_rank}
        self._key: str | None = None  # a map batch's key whose value is being read
        self._ts: float | None = None
        self._events_left: int | None = None  # events not read yet, once their header is read
        self._events: list[KVEvent] = []
        self._rejected: list[RejectedEvent] = []
        self._unread = 0
        self._rank: int | None = None
        self._rank_read = False

    def step(self, max_bytes: int | None = None) -> EventBatch | None:
        """Read on, about `max_bytes` more (None: all the rest); the batch once it is read.
        Raises `EventDecodeError` if the payload is not a KV event batch."""
        end = len(self._payload)
        if max_bytes is not None:
            end = min(end, self._fed + max_bytes)
        self._unpacker.feed(self._payload[self._fed : end])
        self._fed = end
        try:
            return self._read()
        except msgpack.OutOfData:
            if self._fed < len(self._payload):
                return None
            raise EventDecodeError("truncated", "the payload ends inside the batch") from None
        except EventDecodeError:
            raise
        except Exception as exc:  # msgpack raises a zoo of types for malformed input
            # msgpack caps declared lengths by the payload size, so "exceeds max_*" is also a
            # payload that ends before what it announced.
            text = str(exc).lower()
            short = any(w in text for w in ("incomplete", "insufficient", "exceeds max_"))
            reason = "truncated" if short else "malformed"
            raise EventDecodeError(reason, f"not msgpack ({type(exc).__name__}: {exc})") from None

    def _read(self) -> EventBatch:
        """Read as far as the bytes fed allow (`msgpack.OutOfData` when they run out); each
        part is kept once read, so the next call goes on after it."""
        unpacker = self._unpacker
        if self._items is None:
            if self._payload[:1] and self._payload[0] in _MAP_HEADS:
                self._items, self._as_map = unpacker.read_map_header(), True
            else:
                try:
                    self._items = unpacker.read_array_header()
                except ValueError:  # not an array
                    self._items = 0
                if self._items < 2:
                    raise EventDecodeError("malformed", _BATCH_TYPES)
        if self._as_map:
            return self._read_map()
        if self._ts is None:
            ts = unpacker.unpack()
            if not _is_number(ts):
                raise EventDecodeError("malformed", _BATCH_TYPES)
            self._ts = float(ts)
        if self._events_left is None:
            try:
                self._events_left = unpacker.read_array_header()
            except ValueError:  # not an array
                raise EventDecodeError("malformed", _BATCH_TYPES) from None
        self._read_events()
        unpacker = self._unpacker  # another one, if events were skipped
        if self._items > 2 and not self._rank_read:
            rank = unpacker.unpack()
            if not _is_opt_int(rank):
                raise EventDecodeError("malformed", _BATCH_TYPES)
            self._rank, self._rank_read = rank, True
        while self._items > 3:  # fields of a later vLLM: read, ignored
            unpacker.skip()
            self._items -= 1
        if self._unpacker_start + unpacker.tell() != len(self._payload):
            raise EventDecodeError("malformed", "extra bytes after the batch")
        return EventBatch(self._ts, self._events, self._rank, self._rejected, self._unread)

    def _read_map(self) -> EventBatch:
        """A batch encoded as a map (vLLM's struct without `array_like`, as on its main branch
        in 2026): the same fields by name, in any order, unknown ones skipped."""
        while self._items:
            if self._key is None:
                key = self._unpacker.unpack()
                self._key = key if isinstance(key, str) else ""
            if self._key == "ts":
                ts = self._unpacker.unpack()
                if not _is_number(ts):
                    raise EventDecodeError("malformed", _BATCH_TYPES)
                self._ts = float(ts)
            elif self._key == "events" and self._events_left is None:
                try:
                    self._events_left = self._unpacker.read_array_header()
                except ValueError:  # not an array
                    raise EventDecodeError("malformed", _BATCH_TYPES) from None
                self._read_events()
            elif self._key == "events":  # the rest of a read interrupted by the bytes fed
                self._read_events()
            elif self._key == "data_parallel_rank":
                rank = self._unpacker.unpack()
                if not _is_opt_int(rank):
                    raise EventDecodeError("malformed", _BATCH_TYPES)
                self._rank = rank
            else:  # a field of a later vLLM: read, ignored
                self._unpacker.skip()
            self._key = None
            self._items -= 1
        if self._ts is None or self._events_left is None:
            raise EventDecodeError("malformed", _BATCH_TYPES)
        if self._unpacker_start + self._unpacker.tell() != len(self._payload):
            raise EventDecodeError("malformed", "extra bytes after the batch")
        return EventBatch(self._ts, self._events, self._rank, self._rejected, self._unread)

    def _read_events(self) -> None:
        """Decode events until none are left, or skip the rest past the batch's
        `MAX_REJECTED_EVENTS`-th rejection."""
        while self._events_left:
            if len(self._rejected) == MAX_REJECTED_EVENTS:
                self._skip_unread_events(self._events_left)
                return
            raw_event = self._unpacker.unpack()
            try:
                self._events.append(_decode_event(raw_event, self._check_token_ids))
            except _Reject as exc:
                self._rejected.append(RejectedEvent(exc.reason, str(exc), exc.removal))
            self._events_left -= 1

    def _skip_unread_events(self, left: int) -> None:
        """Skip the events left, checked as msgpack but never built, in one parse: a new
        unpacker reads them as one array (its header made up), then the rest of the batch.
        Skipping them one call each cost 15 times the whole junk payload's parse."""
        if not self._skipping:
            start = self._unpacker_start + self._unpacker.tell()
            header = msgpack.Packer().pack_array_header(left)
            self._unpacker = _unpacker(len(header) + len(self._payload) - start)
            self._unpacker.feed(header)
            self._unpacker.feed(self._payload[start : self._fed])
            self._unpacker_start = start - len(header)
            self._unread, self._skipping = left, True
        self._unpacker.skip()
        self._events_left = 0


def _unpacker(size: int) -> msgpack.Unpacker:
    """An unpacker for `size` bytes, which limits declared lengths as `msgpack.unpackb` does
    for a payload of that size."""
    return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(1, size))


_BATCH_TYPES = "a batch is [ts: float, events: list, dp_rank: int], or a map of those"
#: First bytes of a msgpack map: fixmap, map 16, map 32.
_MAP_HEADS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


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
        try:
            return BlockRemoved(
                block_hashes=_hashes(fields),
                medium=_medium(fields),
                group_idx=_opt(fields, "group_idx", int),
            )
        except _Reject as exc:
            exc.removal = True
            raise
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
    if len(value) > MAX_EVENT_BLOCKS:
        raise _Reject("too_many_blocks", f"{len(value)} block hashes (at most {MAX_EVENT_BLOCKS})")
    # vLLM's two forms, each checked in C
    types = set(map(type, value))
    if types <= {bytes} and set(map(len, value)) <= HASH_SIZES:
        return value
    if types == {int} and min(value) >= 0 and max(value) <= _MAX_U64:
        return value
    return [_check_hash(h) for h in value]  # mixed, or the first bad one rejected


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
    if len(value) > MAX_EVENT_BLOCKS:  # one per block
        raise _Reject("too_many_blocks", f"{len(value)} extra_keys (at most {MAX_EVENT_BLOCKS})")
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
