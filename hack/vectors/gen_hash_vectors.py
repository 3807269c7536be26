#!/usr/bin/env python3
"""Generate block-hash test vectors with vLLM's own code (no torch needed).

Reads ``vllm/utils/hashing.py`` and ``vllm/v1/core/kv_cache_utils.py`` straight out of a vLLM
wheel, stubs only the heavy modules that kv_cache_utils imports but the hashing path never calls
(config, multimodal, torch-backed request/interface classes), and runs vLLM's real
``init_none_hash``, ``get_request_block_hasher`` (hence ``generate_block_hash_extra_keys`` and
``hash_block_tokens``) and ``maybe_convert_block_hash`` on a minimal request object.

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm
    python hack/vectors/gen_hash_vectors.py --wheel /tmp/vllm/vllm-0.33.0-*.whl \
        --out tests/data/prefix/hash_vectors.json
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import sys
import types
import zipfile
from pathlib import Path
from typing import Any


class _Anything:
    """Placeholder for names that kv_cache_utils imports but never uses on the hashing path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules can be stubbed too

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<wheel>/{name.replace('.', '/')}.py"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


class _Envs(types.ModuleType):
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False


def load_vllm(wheel: Path) -> tuple[types.ModuleType, types.ModuleType, _Envs]:
    with zipfile.ZipFile(wheel) as zf:
        hashing_src = zf.read("vllm/utils/hashing.py").decode()
        kvcu_src = zf.read("vllm/v1/core/kv_cache_utils.py").decode()
    envs = _Envs("vllm.envs")
    vllm = _stub("vllm", envs=envs)
    sys.modules["vllm.envs"] = envs
    for name in [
        "vllm.config",
        "vllm.multimodal",
        "vllm.multimodal.utils",
        "vllm.utils.math_utils",
        "vllm.v1",
        "vllm.v1.core",
        "vllm.v1.kv_cache_interface",
        "vllm.v1.kv_cache_spec_registry",
        "vllm.v1.request",
        "vllm.v1.utils",
    ]:
        _stub(name)
    import logging

    _stub("vllm.logger", init_logger=logging.getLogger)
    utils = _stub("vllm.utils")
    hashing = _load("vllm.utils.hashing", hashing_src)
    utils.hashing = hashing  # type: ignore[attr-defined]
    vllm.utils = utils  # type: ignore[attr-defined]
    kvcu = _load("vllm.v1.core.kv_cache_utils", kvcu_src)
    return hashing, kvcu, envs


class _LoRARequest:
    def __init__(self, name: str, path: str) -> None:
        self.lora_name = name
        self.lora_path = path


class _Request:
    """The attributes of vllm.v1.request.Request that the block hasher reads."""

    def __init__(self, tokens: list[int], lora: _LoRARequest | None, salt: str | None) -> None:
        self.all_token_ids = tokens
        self.num_tokens = len(tokens)
        self.block_hashes: list[bytes] = []
        self.mm_features: list[Any] = []
        self.lora_request = lora
        self.cache_salt = salt
        self.prompt_embeds = None


def token_ids(rng: random.Random, n: int) -> list[int]:
    # every pickle/CBOR integer width: <24, <256, <2**16, <2**31, <2**32, <2**64, beyond
    pool = [0, 1, 23, 24, 255, 256, 65535, 65536, 151_643, 2**31 - 1, 2**31, 2**32, 2**63]
    return [rng.choice(pool) if i % 4 == 3 else rng.randrange(160_000) for i in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.pop("PYTHONHASHSEED", None)
    hashing, kvcu, envs = load_vllm(args.wheel)
    rng = random.Random(20260101)
    cases = []
    combos = itertools.product(
        ["sha256", "sha256_cbor"],
        [None, "0", "42"],  # None: PYTHONHASHSEED unset
        [None, "tenant-a"],
        [None, ("adapter-x", "/loras/adapter-x")],
        [16, 3],
    )
    for algo, seed, salt, lora, block_size in combos:
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        hash_fn = hashing.get_hash_fn_by_name(algo)
        kvcu.init_none_hash(hash_fn)
        tokens = token_ids(rng, block_size * 5 + block_size // 2)
        request = _Request(tokens, _LoRARequest(*lora) if lora else None, salt)
        block_hasher = kvcu.get_request_block_hasher(block_size, hash_fn)
        hashes = block_hasher(request)
        envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
        int_hashes = [kvcu.maybe_convert_block_hash(h) for h in hashes]
        envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False
        cases.append(
            {
                "algo": algo,
                "block_size": block_size,
                "seed": seed,
                "cache_salt": salt,
                "lora": {"name": lora[0], "path": lora[1]} if lora else None,
                "none_hash": kvcu.NONE_HASH.hex(),
                "token_ids": tokens,
                "block_hashes": [h.hex() for h in hashes],
                "int_block_hashes": int_hashes,
            }
        )
    os.environ.pop("PYTHONHASHSEED", None)
    wheel_sha = hashlib.sha256(args.wheel.read_bytes()).hexdigest()
    doc = {
        "generator": "hack/vectors/gen_hash_vectors.py",
        "vllm_wheel": args.wheel.name,
        "vllm_wheel_sha256": wheel_sha,
        "python": sys.version.split()[0],
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # one case per line: small diffs when vLLM changes, still plain JSON
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    lines = ",\n  ".join(json.dumps(case) for case in cases)
    args.out.write_text(f'{head},\n "cases": [\n  {lines}\n ]\n}}\n')
    print(f"wrote {len(cases)} cases to {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
