"""The bytes kvgate encodes are vLLM's bytes, through one set of event types.

1. Every payload committed in tests/data/events (produced by vLLM's own msgspec classes)
   decodes with kvgate's decoder and re-encodes with kvgate's encoder to the same bytes: map
   events for 0.33, array events (`tagged_arrays`) for 0.10.
2. With a vLLM 0.33 wheel at hand ($KVGATE_VLLM_WHEEL or /tmp/vllm/), the batches a simulated
   engine publishes decode with vLLM's own ``KVEventBatch`` and re-encode to the same bytes, and
   every stored hash is recomputed from its ``token_ids``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import pytest
from tests.vllm_wheel import vllm_wheel

from kvgate.kvevents import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    encode_batch,
    external_hash,
)
from kvgate.prefix import BlockHasher, hash_block
from kvgate.sim.engine import EngineConfig, SimEngine
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import H100_LLAMA3_8B

ROOT = Path(__file__).resolve().parents[3]
VECTORS = ROOT / "tests" / "data" / "events"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


@pytest.mark.parametrize("case", MANIFEST, ids=[c["file"] for c in MANIFEST])
def test_vllm_payloads_decode_and_reencode_to_the_same_bytes(case: dict[str, Any]) -> None:
    payload = (VECTORS / case["file"]).read_bytes()
    batch = decode_batch(payload)
    assert batch.rejected == []
    tagged_arrays = case["event_encoding"] == "array"
    assert encode_batch(batch, tagged_arrays=tagged_arrays) == payload


def test_every_modelled_field_reaches_the_wire() -> None:
    """A field set on an event is encoded (a field the encoder forgot would decode as None)."""
    stored = BlockStored(
        [b"\x01" * 32, b"\x02" * 32], b"\x03" * 32, list(range(32)), 16, lora_id=4,
        medium="CPU", lora_name="a", extra_keys=[("salt",), None], group_idx=2,
        kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
    )  # fmt: skip
    removed = BlockRemoved([b"\x04" * 16], medium="CPU", group_idx=1)
    batch = EventBatch(3.25, [stored, removed, AllBlocksCleared()], data_parallel_rank=1)
    for tagged_arrays in (False, True):
        assert decode_batch(encode_batch(batch, tagged_arrays=tagged_arrays)) == batch


def test_fields_without_a_vllm_default_are_always_encoded() -> None:
    batch = EventBatch(1.0, [BlockStored([1], None, [1], 1), BlockRemoved([1])])
    ts, (stored, removed), rank = msgpack.unpackb(encode_batch(batch))
    assert (ts, rank) == (1.0, None)
    assert list(stored) == ["type", "block_hashes", "parent_block_hash", "token_ids",
                            "block_size", "lora_id", "medium", "lora_name"]  # fmt: skip
    assert removed == {"type": "BlockRemoved", "block_hashes": [1], "medium": None}


def test_int_hashes_publish_the_low_64_bits_of_the_digest() -> None:
    digest, parent = bytes(range(32)), bytes(range(32, 64))
    batch = EventBatch(0.0, [BlockStored([digest], parent, [0] * 16, 16, medium=MEDIUM_GPU)])
    (event,) = decode_batch(encode_batch(batch, int_hashes=True)).events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [int.from_bytes(digest[-8:], "big")]
    assert event.parent_block_hash == int.from_bytes(parent[-8:], "big")
    assert external_hash(7, True) == 7 and external_hash(digest, False) == digest


def _vllm_kv_events() -> ModuleType:
    wheel = vllm_wheel()
    spec = importlib.util.spec_from_file_location(
        "kvgate_events_generate", ROOT / "hack" / "vectors" / "events_generate.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    _version, module = generator.load_kv_events(wheel)
    return module


def _engine_batches() -> list[bytes]:
    """Stored (salted and not), evicted and cleared blocks from a small simulated engine."""
    config = EngineConfig(num_gpu_blocks=12, max_model_len=160, max_num_batched_tokens=64)
    engine = SimEngine(config, H100_LLAMA3_8B, PrefixBlockHasher("sha256", 16, None))
    batches: list[bytes] = []
    now = 0.0
    for i, salt in enumerate([None, "tenant-a", None, None]):
        prompt = [7 * i + t for t in range(70)]
        engine.add_request(str(i), prompt, 20, arrival_time=now, cache_salt=salt)
        for step in engine.run_until_idle(now):
            if step.events:
                batches.append(encode_batch(EventBatch(step.end, step.events, 0)))
            now = step.end
    assert engine.reset_prefix_cache()
    engine.add_request("last", [1, 2, 3], 1, arrival_time=now)
    for step in engine.run_until_idle(now):
        batches.append(encode_batch(EventBatch(step.end, step.events, 0)))
    return batches


def test_engine_batches_decode_with_vllm_classes_and_hashes_recompute() -> None:
    import msgspec

    vllm = _vllm_kv_events()
    decoder = msgspec.msgpack.Decoder(vllm.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    hasher = BlockHasher("sha256", 16, None)
    kinds: set[str] = set()
    for payload in _engine_batches():
        batch = decoder.decode(payload)
        assert encoder.encode(batch) == payload
        assert batch.data_parallel_rank == 0
        for event in batch.events:
            kinds.add(type(event).__name__)
            if isinstance(event, vllm.BlockStored):
                assert event.medium == "GPU" and event.group_idx == 0
                assert len(event.extra_keys) == len(event.block_hashes)
                parent = event.parent_block_hash or hasher.none_hash
                for i, digest in enumerate(event.block_hashes):
                    tokens = event.token_ids[16 * i : 16 * (i + 1)]
                    extra = event.extra_keys[i]
                    salt_key = (("cache_salt", extra[0]),) if extra else None
                    assert hash_block("sha256", parent, tokens, salt_key) == digest
                    parent = digest
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def test_simulated_engine_events_survive_the_wire_unchanged() -> None:
    config = EngineConfig(num_gpu_blocks=12, max_model_len=160, max_num_batched_tokens=64)
    engine = SimEngine(config, H100_LLAMA3_8B, PrefixBlockHasher("sha256", 16, None))
    now, seen = 0.0, 0
    for i, salt in enumerate([None, "tenant-a", None]):
        engine.add_request(str(i), [5 * i + t for t in range(70)], 8, now, cache_salt=salt)
        for step in engine.run_until_idle(now):
            batch = EventBatch(step.end, step.events, 0)
            assert decode_batch(encode_batch(batch)) == batch
            seen += len(step.events)
            now = step.end
    assert seen > 3
