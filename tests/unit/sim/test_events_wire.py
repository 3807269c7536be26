"""The simulator's KV event bytes are vLLM 0.33's bytes.

1. Re-encoding every 0.33 payload committed in tests/data/events (produced by vLLM's own msgspec
   classes) through the simulator's encoder gives the same bytes.
2. With a vLLM 0.33 wheel at hand ($KVGATE_VLLM_WHEEL or /tmp/vllm/), the batches a simulated
   engine publishes decode with vLLM's own ``KVEventBatch`` and re-encode to the same bytes, and
   every stored hash is recomputed from its ``token_ids``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import pytest

from kvgate.prefix import BlockHasher
from kvgate.sim.engine import EngineConfig, SimEngine
from kvgate.sim.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    encode_batch,
)
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import H100_LLAMA3_8B

ROOT = Path(__file__).resolve().parents[3]
VECTORS = ROOT / "tests" / "data" / "events"


def _event_from_map(raw: dict[str, Any]) -> KVEvent:
    kind = raw.pop("type")
    if kind == "BlockStored":
        extra = raw.get("extra_keys")
        if extra is not None:
            raw["extra_keys"] = [None if k is None else tuple(k) for k in extra]
        raw.setdefault("group_idx", None)
        return BlockStored(**raw)
    if kind == "BlockRemoved":
        raw.setdefault("group_idx", None)
        return BlockRemoved(**raw)
    assert kind == "AllBlocksCleared" and not raw
    return AllBlocksCleared()


def test_encoder_reproduces_payloads_made_by_vllm_classes() -> None:
    manifest = json.loads((VECTORS / "manifest.json").read_text())
    checked = 0
    for entry in manifest:
        if entry["vllm"] != "0.33.0":
            continue
        payload = (VECTORS / entry["file"]).read_bytes()
        ts, raw_events, dp_rank = msgpack.unpackb(payload)
        events = [_event_from_map(e) for e in raw_events]
        assert encode_batch(ts, events, dp_rank) == payload, entry["file"]
        checked += 1
    assert checked >= 4


def _find_wheel() -> Path | None:
    env = os.environ.get("KVGATE_VLLM_WHEEL")
    if env:
        return Path(env)
    wheels = sorted(Path("/tmp/vllm").glob("vllm-0.33.0-*.whl"))
    return wheels[0] if wheels else None


def _vllm_kv_events() -> ModuleType:
    wheel = _find_wheel()
    if wheel is None or not wheel.exists():
        pytest.skip("no vLLM 0.33 wheel (set KVGATE_VLLM_WHEEL or pip download it to /tmp/vllm)")
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
                batches.append(encode_batch(step.end, step.events))
            now = step.end
    assert engine.reset_prefix_cache()
    engine.add_request("last", [1, 2, 3], 1, arrival_time=now)
    for step in engine.run_until_idle(now):
        batches.append(encode_batch(step.end, step.events))
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
                    from kvgate.prefix import hash_block

                    assert hash_block("sha256", parent, tokens, salt_key) == digest
                    parent = digest
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
