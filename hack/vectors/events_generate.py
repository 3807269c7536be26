"""Generate KV event payloads with vLLM's own classes (tests/data/events/).

vLLM's `vllm/distributed/kv_events.py` is read from release wheels and executed with its few
vLLM-internal imports stubbed (no torch needed); events are built with its `KVEventBatch`,
`BlockStored`, ... classes and encoded with `msgspec.msgpack` exactly as its ZMQ publisher
does. With a 0.33 wheel it also runs vLLM's real `ZmqEventPublisher` on ipc:// sockets and
records the wire frames (PUB and replay) into `zmq_frames.json`.

The expected decoding of every payload (`manifest.json`) is taken from vLLM's objects, not
from kvgate's decoder. Regenerate with (msgspec is in kvgate's dev extra):

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm
    pip download --no-deps vllm==0.10.0 -d /tmp/vllm010
    .venv/bin/python hack/vectors/events_generate.py --out tests/data/events \
        /tmp/vllm/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        /tmp/vllm010/vllm-0.10.0-cp38-abi3-manylinux1_x86_64.whl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path
from typing import Any

import msgspec
import zmq

MASK64 = (1 << 64) - 1


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def load_kv_events(wheel: Path) -> tuple[str, types.ModuleType]:
    """vLLM's kv_events module from `wheel`, with its vLLM imports stubbed."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("vllm/distributed/kv_events.py").decode()
        version = next(
            n.split("/")[0].removesuffix(".dist-info").split("-")[1]
            for n in zf.namelist()
            if n.endswith(".dist-info/METADATA")
        )

    class KVEventsConfig:  # only constructed by the publisher; fields are irrelevant here
        def __init__(self, **kwargs: Any) -> None:
            self.__dict__.update(kwargs)

    stubs = {
        "vllm": _stub("vllm"),
        "vllm.config": _stub("vllm.config", KVEventsConfig=KVEventsConfig),
        "vllm.config.kv_events": _stub("vllm.config.kv_events", KVEventsConfig=KVEventsConfig),
        "vllm.logger": _stub("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils": _stub("vllm.utils"),
        "vllm.utils.network_utils": _stub(
            "vllm.utils.network_utils",
            get_ip=lambda: "127.0.0.1",
            get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
            is_valid_ipv6_address=lambda ip: False,
            split_zmq_path=lambda path: tuple(path.rsplit(":", 2)),
        ),
        "vllm.v1": _stub("vllm.v1"),
        "vllm.v1.core": _stub("vllm.v1.core"),
        "vllm.v1.core.kv_cache_utils": _stub(
            "vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int
        ),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType(f"vllm_kv_events_{version.replace('.', '_')}")
        sys.modules[module.__name__] = module  # msgspec resolves annotations through it
        exec(
            compile(source, f"{wheel.name}!vllm/distributed/kv_events.py", "exec"), module.__dict__
        )
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return version, module


def digest(tag: str) -> bytes:
    return hashlib.sha256(tag.encode()).digest()


def expected(event: Any) -> dict[str, Any]:
    """The JSON `kvgate events decode` must print, read off vLLM's event object."""

    def show(h: Any) -> Any:
        return h.hex() if isinstance(h, bytes) else h

    kind = type(event).__name__
    if kind == "BlockStored":
        return {
            "type": kind,
            "block_hashes": [show(h) for h in event.block_hashes],
            "parent_block_hash": show(event.parent_block_hash),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_name": getattr(event, "lora_name", None),
            "medium": getattr(event, "medium", None),
        }
    if kind == "BlockRemoved":
        return {
            "type": kind,
            "block_hashes": [show(h) for h in event.block_hashes],
            "medium": getattr(event, "medium", None),
        }
    return {"type": kind}


def cases_new(kv: types.ModuleType) -> dict[str, Any]:
    """vLLM >= 0.11 field set (map-encoded events in 0.33)."""
    h = [digest(f"block/{i}") for i in range(6)]
    ints = [int.from_bytes(x, "big") & MASK64 for x in h]
    tokens = list(range(1000, 1048))
    stored = kv.BlockStored(
        block_hashes=h[:3], parent_block_hash=None, token_ids=tokens, block_size=16,
        lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    lora_child = kv.BlockStored(
        block_hashes=h[3:5], parent_block_hash=h[2], token_ids=tokens[:32], block_size=16,
        lora_id=3, medium=None, lora_name="sql-adapter", extra_keys=[("sql-adapter",)] * 2,
        group_idx=0, kv_cache_spec_kind="full_attention",
    )  # fmt: skip
    return {
        "stored_bytes": kv.KVEventBatch(ts=1.5, events=[stored], data_parallel_rank=0),
        "stored_lora_child": kv.KVEventBatch(ts=2.0, events=[lora_child]),
        "mixed_removed_cleared": kv.KVEventBatch(
            ts=3.25,
            events=[
                kv.BlockStored(
                    block_hashes=h[5:6],
                    parent_block_hash=h[4],
                    token_ids=tokens[:16],
                    block_size=16,
                    lora_id=None,
                    medium="CPU",
                    lora_name=None,
                ),
                kv.BlockRemoved(block_hashes=h[:2], medium="GPU"),
                kv.BlockRemoved(block_hashes=h[5:6], medium="CPU", group_idx=0),
                kv.AllBlocksCleared(),
            ],
            data_parallel_rank=1,
        ),
        "int_hashes": kv.KVEventBatch(
            ts=4.0,
            events=[
                kv.BlockStored(
                    block_hashes=ints[:3],
                    parent_block_hash=None,
                    token_ids=tokens,
                    block_size=16,
                    lora_id=None,
                    medium=None,
                    lora_name=None,
                ),
                kv.BlockRemoved(block_hashes=ints[2:3], medium=None),
            ],
            data_parallel_rank=0,
        ),
    }


def cases_old(kv: types.ModuleType) -> dict[str, Any]:
    """vLLM 0.10 field set (array-tagged events, int hashes, no medium)."""
    ints = [int.from_bytes(digest(f"old/{i}"), "big") & MASK64 for i in range(4)]
    return {
        "stored_removed_cleared": kv.KVEventBatch(
            ts=10.0,
            events=[
                kv.BlockStored(
                    block_hashes=ints[:2],
                    parent_block_hash=None,
                    token_ids=list(range(32)),
                    block_size=16,
                    lora_id=None,
                ),
                kv.BlockStored(
                    block_hashes=ints[2:4],
                    parent_block_hash=ints[1],
                    token_ids=list(range(32, 64)),
                    block_size=16,
                    lora_id=7,
                ),
                kv.BlockRemoved(block_hashes=ints[:1]),
                kv.AllBlocksCleared(),
            ],
        ),
    }


def record_zmq_frames(kv: types.ModuleType, out: Path) -> None:
    """Run vLLM's ZmqEventPublisher; record what a subscriber and a replay client receive."""
    with tempfile.TemporaryDirectory() as tmp:
        pub_ep, replay_ep = f"ipc://{tmp}/pub", f"ipc://{tmp}/replay"
        publisher = kv.ZmqEventPublisher(
            data_parallel_rank=0, endpoint=pub_ep, replay_endpoint=replay_ep, topic="kv@pod@m"
        )
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@pod@m")
        sub.connect(pub_ep)
        time.sleep(0.5)  # slow joiner
        h = [digest(f"zmq/{i}") for i in range(3)]
        for i in range(3):
            publisher.publish(kv.KVEventBatch(ts=float(i), events=[kv.BlockStored(
                block_hashes=[h[i]], parent_block_hash=h[i - 1] if i else None,
                token_ids=list(range(16)), block_size=16, lora_id=None, medium="GPU",
                lora_name=None)]))  # fmt: skip
        sub.setsockopt(zmq.RCVTIMEO, 5000)
        published = [sub.recv_multipart() for _ in range(3)]
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 5000)
        dealer.connect(replay_ep)
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while True:
            frames = dealer.recv_multipart()
            replayed.append(frames)
            if frames[-2] == (-1).to_bytes(8, "big", signed=True):
                break
        publisher.shutdown()
        sub.close(0)
        dealer.close(0)
        ctx.term()
    doc = {
        "note": "vLLM ZmqEventPublisher frames; replay asked from seq 1 over a DEALER socket",
        "published": [[f.hex() for f in m] for m in published],
        "replay_request": ["", (1).to_bytes(8, "big").hex()],
        "replayed": [[f.hex() for f in m] for m in replayed],
    }
    (out / "zmq_frames.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("wheels", type=Path, nargs="+")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.msgpack.Encoder()
    manifest = []
    for wheel in args.wheels:
        version, kv = load_kv_events(wheel)
        new = hasattr(kv, "MEDIUM_GPU")
        encoding = "array" if _array_tagged(kv) else "map"
        for name, batch in (cases_new(kv) if new else cases_old(kv)).items():
            file = f"vllm-{version}-{name}.msgpack"
            (args.out / file).write_bytes(encoder.encode(batch))
            manifest.append({
                "file": file, "vllm": version, "event_encoding": encoding, "ts": batch.ts,
                "data_parallel_rank": batch.data_parallel_rank,
                "events": [expected(e) for e in batch.events],
            })  # fmt: skip
        if new:
            record_zmq_frames(kv, args.out)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


def _array_tagged(kv: types.ModuleType) -> bool:
    encoded = msgspec.msgpack.encode(kv.AllBlocksCleared())
    return isinstance(msgspec.msgpack.decode(encoded), list)


if __name__ == "__main__":
    raise SystemExit(main())
