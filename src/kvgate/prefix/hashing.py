"""vLLM-exact chained block hashes (vLLM 0.33 ``hash_block_tokens``).

Algorithm, as in ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/utils/hashing.py``:

- ``hash_fn(obj)`` is ``sha256(pickle.dumps(obj, protocol=5))`` for ``sha256`` (vLLM uses
  ``pickle.HIGHEST_PROTOCOL``, which is 5 on every supported CPython) or
  ``sha256(cbor2.dumps(obj, canonical=True))`` for ``sha256_cbor``.
- ``NONE_HASH = hash_fn(seed)`` where ``seed`` is the string in ``PYTHONHASHSEED`` when the
  engine has it set, else ``"vllm-none-hash"``.
- A prompt is cut into blocks of ``block_size`` tokens; only full blocks are hashed. Block ``i``
  has hash ``hash_fn((parent, tuple(block_tokens), extra_keys))`` where ``parent`` is block
  ``i-1``'s hash (``NONE_HASH`` for block 0).
- ``extra_keys`` is ``None`` when empty, else a tuple in vLLM's order: ``("lora", name, path)``
  on every block of a LoRA request, then ``("cache_salt", salt)`` on block 0 only (a falsy
  salt adds nothing). Multimodal and prompt-embeds keys are out of scope (text only).

Exactness is by construction: every block is serialised by the real ``pickle``/``cbor2`` on the
same Python objects vLLM builds; the committed vectors in ``tests/data/prefix`` were produced
by vLLM's own functions. Speed comes from a chain cache: ``(parent, block tokens, extra keys)``
→ digest, kept in two generations (an approximate LRU with O(1) upkeep). A prompt that extends
a previously seen prefix walks the cache until the first miss and hashes only the new blocks;
after a miss no child can be cached, so the rest is hashed without lookups.

Integer form: with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` vLLM publishes
``int.from_bytes(digest, "big") & (2**64 - 1)``, i.e. the digest's last 8 bytes read big-endian.
kvgate's ``BlockKey`` for such pools is those 8 bytes (see docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import cbor2

BlockKey: TypeAlias = bytes
"""What the directory stores: a 32-byte digest, or 8 big-endian bytes of the 64-bit int form."""

HashAlgo: TypeAlias = Literal["sha256", "sha256_cbor"]
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "sha256_cbor")

DEFAULT_SEED = "vllm-none-hash"
"""vLLM's NONE_HASH seed for sha256/sha256_cbor when PYTHONHASHSEED is unset."""

PICKLE_PROTOCOL = 5
"""``pickle.HIGHEST_PROTOCOL`` on CPython 3.8-3.13, the protocol vLLM's ``sha256`` uses."""

DIGEST_SIZE = 32
INT_KEY_SIZE = 8
_MASK64 = (1 << 64) - 1

ExtraKeys: TypeAlias = tuple[tuple[str, ...], ...] | None


@dataclass(frozen=True, slots=True)
class LoraKey:
    """A LoRA adapter as vLLM keys it: name and path (``LoRARequest.lora_name/lora_path``)."""

    name: str
    path: str


def serialize(algo: HashAlgo, obj: Any) -> bytes:
    """The bytes vLLM feeds to SHA-256 for ``obj`` under ``algo``."""
    if algo == "sha256":
        return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)
    if algo == "sha256_cbor":
        data: bytes = cbor2.dumps(obj, canonical=True)
        return data
    raise ValueError(f"unsupported hash algorithm {algo!r}; expected one of {HASH_ALGOS}")


def hash_object(algo: HashAlgo, obj: Any) -> bytes:
    """vLLM's ``get_hash_fn_by_name(algo)(obj)``."""
    return hashlib.sha256(serialize(algo, obj)).digest()


def none_hash(algo: HashAlgo, seed: str | None = None) -> bytes:
    """vLLM's ``NONE_HASH``: the hash of the seed string (default ``"vllm-none-hash"``)."""
    return hash_object(algo, DEFAULT_SEED if seed is None else seed)


def extra_keys_for_block(
    block_index: int, lora: LoraKey | None = None, cache_salt: str | None = None
) -> ExtraKeys:
    """vLLM's ``generate_block_hash_extra_keys`` for a text-only request."""
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append(("lora", lora.name, lora.path))
    if block_index == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def hash_block(
    algo: HashAlgo,
    parent: bytes,
    block_tokens: Sequence[int],
    extra_keys: ExtraKeys = None,
) -> bytes:
    """One block's hash: ``hash_fn((parent, tuple(tokens), extra_keys))``."""
    return hash_object(algo, (parent, tuple(block_tokens), extra_keys))


def int_form(digest: bytes) -> int:
    """The 64-bit integer vLLM publishes with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``."""
    return int.from_bytes(digest, "big") & _MASK64


def int_block_key(value: int) -> BlockKey:
    """The block key of an integer hash from a KV event (8 big-endian bytes)."""
    if not 0 <= value <= _MASK64:
        raise ValueError(f"integer block hash out of the 64-bit range: {value}")
    return value.to_bytes(INT_KEY_SIZE, "big")


def block_key(block_hash: bytes | int, *, int_keys: bool = False) -> BlockKey:
    """Normalise a hash (computed digest, or bytes/int from a KV event) to a ``BlockKey``.

    With ``int_keys`` (pools whose engines publish integer hashes) a 32-byte digest becomes its
    64-bit form, so keys from prompts and keys from events compare equal exactly when vLLM
    would hit. Ints are always 64-bit keys; other byte strings are kept as they are.
    """
    if isinstance(block_hash, int):
        return int_block_key(block_hash)
    if int_keys and len(block_hash) == DIGEST_SIZE:
        return block_hash[-INT_KEY_SIZE:]
    return bytes(block_hash)


class ChainCache:
    """Bounded map ``(parent, block tokens, extra keys) -> digest``; two-generation LRU.

    Lookups that hit the older generation promote the entry. When the young generation holds
    ``capacity // 2`` entries it becomes the old one and the previous old one is dropped, so
    at most ``capacity`` entries are kept and no per-access bookkeeping is needed.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("chain cache capacity must be >= 0")
        self.capacity = capacity
        self._young: dict[tuple[Any, ...], bytes] = {}
        self._old: dict[tuple[Any, ...], bytes] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def get(self, key: tuple[Any, ...]) -> bytes | None:
        digest = self._young.get(key)
        if digest is None:
            digest = self._old.get(key)
            if digest is not None:
                self.put(key, digest)
        return digest

    def put(self, key: tuple[Any, ...], digest: bytes) -> None:
        if self.capacity == 0:
            return
        if len(self._young) >= max(1, self.capacity // 2):
            self._old = self._young
            self._young = {}
        self._young[key] = digest

    def clear(self) -> None:
        self._young.clear()
        self._old.clear()


class BlockHasher:
    """Chained block hashes for one pool's engine settings (algo, block size, seed).

    ``hash_blocks`` returns the 32-byte digests vLLM computes for the full blocks of a prompt;
    ``block_keys`` returns them as directory keys (optionally in the 64-bit int form).
    Token ids must be Python ``int`` values (as parsed from JSON), like vLLM's.
    """

    def __init__(
        self,
        algo: HashAlgo = "sha256",
        block_size: int = 16,
        seed: str | None = None,
        *,
        cache_blocks: int = 65536,
    ) -> None:
        if algo not in HASH_ALGOS:
            raise ValueError(f"unsupported hash algorithm {algo!r}; expected one of {HASH_ALGOS}")
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.algo: HashAlgo = algo
        self.block_size = block_size
        self.seed = DEFAULT_SEED if seed is None else seed
        self.none_hash = none_hash(algo, self.seed)
        self.cache = ChainCache(cache_blocks)

    def __repr__(self) -> str:
        return f"BlockHasher(algo={self.algo!r}, block_size={self.block_size}, seed={self.seed!r})"

    def num_full_blocks(self, num_tokens: int) -> int:
        return num_tokens // self.block_size

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraKey | None = None,
        cache_salt: str | None = None,
    ) -> list[bytes]:
        """Digests of every full block of ``token_ids``, in order."""
        size = self.block_size
        tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
        blocks = [tokens[i : i + size] for i in range(0, len(tokens) - size + 1, size)]
        if not blocks:
            return []
        first_extra = extra_keys_for_block(0, lora, cache_salt)
        rest_extra = extra_keys_for_block(1, lora, cache_salt)
        out: list[bytes] = []
        parent = self.none_hash
        cache = self.cache
        get = cache.get
        # Walk the cache until the first miss: a hit means the whole chain up to here was seen.
        index = 0
        for block in blocks:
            digest = get((parent, block, rest_extra if index else first_extra))
            if digest is None:
                break
            out.append(digest)
            parent = digest
            index += 1
        cache.hits += index
        cache.misses += len(blocks) - index
        if index == len(blocks):
            return out
        # Cold tail: no child of a new digest can be cached, so hash without lookups.
        put = cache.put
        if self.algo == "sha256":
            dumps = pickle.dumps
            sha = hashlib.sha256
            for block in blocks[index:]:
                extra = rest_extra if index else first_extra
                digest = sha(dumps((parent, block, extra), PICKLE_PROTOCOL)).digest()
                put((parent, block, extra), digest)
                out.append(digest)
                parent = digest
                index += 1
        else:
            for block in blocks[index:]:
                extra = rest_extra if index else first_extra
                digest = hash_object(self.algo, (parent, block, extra))
                put((parent, block, extra), digest)
                out.append(digest)
                parent = digest
                index += 1
        return out

    def block_keys(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraKey | None = None,
        cache_salt: str | None = None,
        int_form: bool = False,
    ) -> list[BlockKey]:
        """Directory keys of every full block (``int_form``: 8-byte 64-bit keys)."""
        digests = self.hash_blocks(token_ids, lora=lora, cache_salt=cache_salt)
        if not int_form:
            return digests
        return [digest[-INT_KEY_SIZE:] for digest in digests]
