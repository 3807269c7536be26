"""KV event decoding against payloads produced by vLLM's own classes, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvgate.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    decode_batch,
    encode_batch,
    event_to_json,
)
from kvgate.kvevents.decode import MAX_EVENT_BLOCKS, MAX_REJECTED_EVENTS, BatchDecoder

DATA = Path(__file__).parents[2] / "data" / "events"
MANIFEST = json.loads((DATA / "manifest.json").read_text())


@pytest.mark.parametrize("case", MANIFEST, ids=[c["file"] for c in MANIFEST])
def test_vllm_payloads_decode_as_vllm_meant(case: dict[str, Any]) -> None:
    batch = decode_batch((DATA / case["file"]).read_bytes())
    assert batch.rejected == []
    assert batch.ts == case["ts"]
    assert batch.data_parallel_rank == case["data_parallel_rank"]
    assert [event_to_json(e) for e in batch.events] == case["events"]


def test_both_event_encodings_are_covered() -> None:
    assert {c["event_encoding"] for c in MANIFEST} == {"map", "array"}


def test_keys_from_bytes_and_int_hashes() -> None:
    batch = decode_batch((DATA / "vllm-0.33.0-int_hashes.msgpack").read_bytes())
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert all(isinstance(h, int) for h in stored.block_hashes)
    assert stored.keys == [h.to_bytes(8, "big") for h in stored.block_hashes]  # type: ignore[union-attr]
    batch = decode_batch((DATA / "vllm-0.33.0-stored_bytes.msgpack").read_bytes())
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert stored.keys == stored.block_hashes and all(len(k) == 32 for k in stored.keys)


def test_lora_and_group_fields() -> None:
    batch = decode_batch((DATA / "vllm-0.33.0-stored_lora_child.msgpack").read_bytes())
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert (stored.lora_id, stored.lora_name, stored.group_idx) == (3, "sql-adapter", 0)


def test_real_publisher_frames_decode() -> None:
    frames = json.loads((DATA / "zmq_frames.json").read_text())
    for topic, seq, payload in frames["published"]:
        assert bytes.fromhex(topic) == b"kv@pod@m"
        batch = decode_batch(bytes.fromhex(payload))
        assert isinstance(batch.events[0], BlockStored)
        assert int(seq, 16) < 3


@pytest.mark.parametrize("tagged_arrays", [False, True])
def test_encode_decode_round_trip(tagged_arrays: bool) -> None:
    batch = EventBatch(
        ts=5.0,
        events=[
            BlockStored([b"\x01" * 32], None, list(range(16)), 16, medium="CPU"),
            BlockStored([7, 8], 6, list(range(32)), 16, lora_id=2, lora_name="x", group_idx=1),
            BlockRemoved([b"\x02" * 16]),
            AllBlocksCleared(),
        ],
        data_parallel_rank=2,
    )
    assert decode_batch(encode_batch(batch, tagged_arrays=tagged_arrays)) == batch


def _payload(events: list[Any]) -> bytes:
    out: bytes = msgpack.packb([1.0, events, 0], use_bin_type=True)
    return out


GOOD = {"type": "BlockRemoved", "block_hashes": [b"\x03" * 32], "medium": "GPU"}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "truncated"),
        (b"\x93\xcb", "truncated"),
        (b"\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\xdd\x00\x00\x10\x00", "truncated"),
        ((DATA / "vllm-0.33.0-stored_bytes.msgpack").read_bytes()[:40], "truncated"),
        (b"\xc1\xc1\xc1", "malformed"),
        (msgpack.packb(42), "malformed"),
        (msgpack.packb([1.0]), "malformed"),
        (msgpack.packb(["ts", []]), "malformed"),
        (msgpack.packb([1.0, {"a": 1}]), "malformed"),
        (msgpack.packb([1.0, [], "rank"]), "malformed"),
        ((DATA / "vllm-0.33.0-stored_bytes.msgpack").read_bytes() + b"\x00", "malformed"),
    ],
)
def test_bad_payloads_raise_one_error_type(payload: bytes, reason: str) -> None:
    with pytest.raises(EventDecodeError) as exc:
        decode_batch(payload)
    assert exc.value.reason == reason


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"type": "BlockEvicted", "block_hashes": []}, "unknown_type"),
        (["Mystery", 1, 2], "unknown_type"),
        ({"type": "BlockRemoved", "block_hashes": [b"\x01" * 31]}, "bad_hash"),
        ({"type": "BlockRemoved", "block_hashes": [-5]}, "bad_hash"),
        ({"type": "BlockRemoved", "block_hashes": [True]}, "bad_hash"),
        ({"type": "BlockRemoved", "block_hashes": ["ab"]}, "bad_hash"),
        ({"type": "BlockRemoved", "block_hashes": b"\x01" * 32}, "bad_field"),
        ({"type": "BlockRemoved", "block_hashes": [], "medium": "G,C"}, "bad_field"),
        ({"type": "BlockRemoved", "block_hashes": [], "medium": 3}, "bad_field"),
        (["BlockStored", [b"\x01" * 32], None, [1, 2]], "bad_field"),  # no block_size
        (["BlockStored", [b"\x01" * 32], None, [1, "x"], 16], "bad_field"),
        (
            {
                "type": "BlockStored",
                "block_hashes": [],
                "token_ids": [],
                "block_size": 16,
                "parent_block_hash": b"short",
            },
            "bad_hash",
        ),
        (17, "malformed_event"),
        ({"no": "type"}, "malformed_event"),
        ([], "malformed_event"),
    ],
)
def test_bad_events_are_rejected_and_the_rest_kept(event: Any, reason: str) -> None:
    batch = decode_batch(_payload([GOOD, event, GOOD]))
    assert [r.reason for r in batch.rejected] == [reason]
    assert batch.events == [BlockRemoved([b"\x03" * 32], "GPU")] * 2


def test_a_batch_is_read_up_to_its_64th_bad_event() -> None:
    """Past it the events are only counted: rejecting one costs an exception, and a pod can
    send a megabyte of them in one message."""
    batch = decode_batch(_payload([GOOD, *[17] * 100, GOOD]))
    assert len(batch.rejected) == MAX_REJECTED_EVENTS == 64
    assert batch.unread_events == 100 - 64 + 1  # the good event after the junk too
    assert batch.events == [BlockRemoved([b"\x03" * 32], "GPU")]


def _in_slices(payload: bytes, slice_bytes: int) -> EventBatch:
    decoder = BatchDecoder(payload)
    for _ in range(len(payload) // slice_bytes + 1):
        if (batch := decoder.step(slice_bytes)) is not None:
            return batch
    raise AssertionError("the payload was read to its end without a batch")


@pytest.mark.parametrize("slice_bytes", [1, 7, 64, 1 << 20])
def test_a_payload_decoded_in_slices_is_the_same_batch(slice_bytes: int) -> None:
    """Slices end anywhere, inside a header or a long list, and the parse resumes there."""
    payload = _payload([GOOD, 17, {"type": "BlockStored", "block_hashes": [b"\x05" * 16],
                                   "parent_block_hash": None, "token_ids": list(range(300)),
                                   "block_size": 300}, ["AllBlocksCleared"]])  # fmt: skip
    assert _in_slices(payload, slice_bytes) == decode_batch(payload)
    junk = _payload([GOOD, *[17] * 100, GOOD])
    assert _in_slices(junk, slice_bytes) == decode_batch(junk)


@pytest.mark.parametrize("slice_bytes", [1, 64])
def test_a_payload_cut_short_is_truncated_whatever_the_slices(slice_bytes: int) -> None:
    for events in ([GOOD] * 10, [*[17] * 100, GOOD]):  # the second cut among skipped events
        with pytest.raises(EventDecodeError) as exc:
            _in_slices(_payload(events)[:-5], slice_bytes)
        assert exc.value.reason == "truncated"
    with pytest.raises(EventDecodeError) as exc:
        _in_slices(_payload([GOOD]) + b"\x00", slice_bytes)
    assert exc.value.reason == "malformed"


def test_a_rejection_shows_what_the_pod_sent_in_short() -> None:
    [rejected] = decode_batch(_payload([list(range(100_000))])).rejected  # no tag
    assert rejected.reason == "malformed_event" and "a list of 100000" in rejected.detail
    [rejected] = decode_batch(_payload([{"type": "y" * 10_000}])).rejected
    assert rejected.reason == "unknown_type" and len(rejected.detail) < 100


def test_optional_trailing_fields_may_be_absent() -> None:
    batch = decode_batch(
        _payload(
            [["BlockStored", [1], None, [1, 2], 2], ["BlockRemoved", [1]], ["AllBlocksCleared"]]
        )
    )
    assert batch.events == [
        BlockStored([1], None, [1, 2], 2),
        BlockRemoved([1]),
        AllBlocksCleared(),
    ]
    batch = decode_batch(msgpack.packb([2.0, []]))
    assert batch.data_parallel_rank is None


def test_hash_must_fit_64_bits() -> None:
    # msgpack cannot even carry larger ints; the top of the range is fine
    batch = decode_batch(_payload([["BlockRemoved", [2**64 - 1, 0]]]))
    assert batch.events == [BlockRemoved([2**64 - 1, 0])]


def test_an_event_of_more_blocks_than_a_step_caches_is_rejected() -> None:
    """An event is checked in one piece: its hashes are bounded before they are read (one of
    900k int hashes, an 8 MiB message, held the event loop 0.6 s). Up to the bound, int
    hashes and bytes hashes are taken whole; mixed, each is checked."""
    at_cap = list(range(MAX_EVENT_BLOCKS))
    over = [*at_cap, 0]
    extra = {"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None,
             "token_ids": [], "block_size": 16, "extra_keys": [[]] * (MAX_EVENT_BLOCKS + 1)}  # fmt: skip
    batch = decode_batch(
        _payload([["BlockRemoved", at_cap], ["BlockRemoved", over], extra, GOOD]),
        check_token_ids=False,
    )
    assert [r.reason for r in batch.rejected] == ["too_many_blocks"] * 2
    assert batch.events == [BlockRemoved(at_cap), BlockRemoved([b"\x03" * 32], "GPU")]
    mixed = decode_batch(_payload([["BlockRemoved", [b"\x01" * 16, 7]]]))
    assert mixed.events == [BlockRemoved([b"\x01" * 16, 7])]
    negative = decode_batch(_payload([["BlockRemoved", [*range(1000), -1]]]))
    assert [r.reason for r in negative.rejected] == ["bad_hash"]


def test_token_ids_check_can_be_skipped_by_the_indexer() -> None:
    payload = _payload([["BlockStored", [b"\x01" * 32], None, [1, "x"], 16]])
    assert [r.reason for r in decode_batch(payload).rejected] == ["bad_field"]
    batch = decode_batch(payload, check_token_ids=False)
    assert batch.rejected == [] and len(batch.events) == 1
    not_a_list = _payload([["BlockStored", [b"\x01" * 32], None, 5, 16]])
    assert decode_batch(not_a_list, check_token_ids=False).rejected[0].reason == "bad_field"


@pytest.mark.parametrize("slice_bytes", [1, 7, 64, 1 << 20])
def test_a_batch_encoded_as_a_map_is_the_same_batch(slice_bytes: int) -> None:
    """vLLM's main branch encodes `EventBatch` without `array_like`: a map of its fields. Read
    as an array only, every batch of such an engine was malformed, and nothing was indexed."""
    stored = {"type": "BlockStored", "block_hashes": [b"\x05" * 16], "parent_block_hash": None,
              "token_ids": list(range(300)), "block_size": 300, "lora_name": None}  # fmt: skip
    events = [GOOD, stored, {"type": "AllBlocksCleared"}, *[17] * 70, GOOD]
    as_array = _payload(events)
    as_map = msgpack.packb(
        {"ts": 1.0, "events": events, "data_parallel_rank": 0, "later": [1]}, use_bin_type=True
    )
    assert _in_slices(as_map, slice_bytes) == decode_batch(as_array)
    reordered = msgpack.packb({"data_parallel_rank": None, "events": [GOOD], "ts": 2})
    assert decode_batch(reordered) == EventBatch(2.0, [BlockRemoved([b"\x03" * 32], "GPU")])
    for bad in ({"ts": 1.0}, {"events": []}, {"ts": "x", "events": []}, {"ts": 1.0, "events": 3}):
        with pytest.raises(EventDecodeError):
            decode_batch(msgpack.packb(bad))
