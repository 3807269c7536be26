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
by vLLM's own functions. Speed comes from a chain cache keyed by aligned spans of blocks:
``(parent digest, span tokens, extra keys)`` → the span's digests, kept in two generations (an
approximate LRU with O(1) upkeep, bounded in bytes). A prompt that extends a previously seen prefix walks its
spans until the first miss and hashes only what follows; after a miss no descendant can be
cached, so the rest is hashed without lookups.

Integer form: with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` vLLM publishes
``int.from_bytes(digest, "big") & (2**64 - 1)``, i.e. the digest's last 8 bytes read big-endian.
kvgate's ``BlockKey`` for such pools is those 8 bytes (see docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import pickle
import threading
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
DEFAULT_CHAIN_CACHE_BYTES = 32 << 20
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


def max_cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks of a prompt that vLLM can serve from its prefix cache.

    vLLM must compute at least the last prompt token to get logits, so a lookup is capped at
    ``num_tokens - 1`` tokens: a block-aligned prompt never hits on its final block.
    """
    return max(0, num_tokens - 1) // block_size


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


def span_entry_bytes(span_blocks: int, block_size: int) -> int:
    """What one chain-cache entry may cost: the key (parent digest, a tuple of
    ``span_blocks * block_size`` token ids, each counted as an 8-byte slot plus an int object
    of its own (32 bytes allocated), the worst case) and the value (a tuple of digests)."""
    tokens = span_blocks * block_size
    digest = 33 + DIGEST_SIZE  # a bytes object
    key = 64 + digest + 40 + tokens * (8 + 32)
    value = 40 + span_blocks * (8 + digest)
    return key + value + 100  # + the dict slot


class ChainCache:
    """Bounded map ``(parent, span tokens, extra keys) -> span digests``; two-generation LRU.

    Lookups that hit the older generation promote the entry. When the young generation holds
    ``capacity // 2`` entries it becomes the old one and the previous old one is dropped, so
    at most ``capacity`` entries are kept and no per-access bookkeeping is needed. Safe for
    concurrent use (a lock around each dictionary operation, never around hashing).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("chain cache capacity must be >= 0")
        self.capacity = capacity
        self._young: dict[tuple[Any, ...], tuple[bytes, ...]] = {}
        self._old: dict[tuple[Any, ...], tuple[bytes, ...]] = {}
        self._lock = threading.Lock()
        self.hit_blocks = 0
        self.hashed_blocks = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def get(self, key: tuple[Any, ...]) -> tuple[bytes, ...] | None:
        with self._lock:
            digests = self._young.get(key)
            if digests is None:
                digests = self._old.get(key)
                if digests is not None:
                    self._put(key, digests)
            return digests

    def put(self, key: tuple[Any, ...], digests: tuple[bytes, ...]) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._put(key, digests)

    def _put(self, key: tuple[Any, ...], digests: tuple[bytes, ...]) -> None:
        if len(self._young) >= max(1, self.capacity // 2):
            self._old = self._young
            self._young = {}
        self._young[key] = digests

    def count(self, hit_blocks: int, hashed_blocks: int) -> None:
        with self._lock:
            self.hit_blocks += hit_blocks
            self.hashed_blocks += hashed_blocks

    def clear(self) -> None:
        with self._lock:
            self._young.clear()
            self._old.clear()


class BlockHasher:
    """Chained block hashes for one pool's engine settings (algo, block size, seed).

    ``hash_blocks`` returns the 32-byte digests vLLM computes for the full blocks of a prompt;
    ``block_keys`` returns them as directory keys (optionally in the 64-bit int form).
    Token ids must be Python ``int`` values (as parsed from JSON), like vLLM's.

    Reuse: digests are cached per aligned *span* of ``span_blocks`` blocks, keyed by the
    span's parent digest, its tokens and its extra keys. A prompt walks its spans from block 0
    while they hit, then hashes the rest. Span granularity keeps the walk cheap (one dict
    lookup per ~512 tokens); a prompt that diverges inside a span rehashes at most
    ``span_blocks - 1`` blocks that were seen before. The cache holds at most ``cache_bytes``
    (``span_entry_bytes`` per span); ``cache_bytes=0`` disables it. Safe for concurrent use.
    """

    def __init__(
        self,
        algo: HashAlgo = "sha256",
        block_size: int = 16,
        seed: str | None = None,
        *,
        cache_bytes: int = DEFAULT_CHAIN_CACHE_BYTES,
        span_blocks: int | None = None,
    ) -> None:
        if algo not in HASH_ALGOS:
            raise ValueError(f"unsupported hash algorithm {algo!r}; expected one of {HASH_ALGOS}")
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.algo: HashAlgo = algo
        self.block_size = block_size
        self.seed = DEFAULT_SEED if seed is None else seed
        self.none_hash = none_hash(algo, self.seed)
        self.span_blocks = span_blocks or max(1, 512 // block_size)
        if cache_bytes < 0:
            raise ValueError("chain cache budget must be >= 0 bytes")
        self.cache = ChainCache(cache_bytes // span_entry_bytes(self.span_blocks, block_size))

    def __repr__(self) -> str:
        return f"BlockHasher(algo={self.algo!r}, block_size={self.block_size}, seed={self.seed!r})"

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraKey | None = None,
        cache_salt: str | None = None,
        known: Sequence[bytes] = (),
    ) -> list[bytes]:
        """Digests of every full block of ``token_ids``, in order. ``known``: digests of the
        first blocks already computed by this hasher for the same tokens, salt and LoRA (the
        caller vouches for that); only whole spans of them are used."""
        size = self.block_size
        tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
        num_blocks = len(tokens) // size
        first_extra = extra_keys_for_block(0, lora, cache_salt)
        rest_extra = extra_keys_for_block(1, lora, cache_salt)
        cache = self.cache
        span = self.span_blocks
        span_tokens = span * size
        # 1. Start after the known spans, then walk cached spans while they hit.
        block = min(len(known), num_blocks) // span * span
        out: list[bytes] = list(known[:block])
        parent = out[-1] if block else self.none_hash
        if cache.capacity:
            get = cache.get
            while block + span <= num_blocks:
                start = block * size
                key = (
                    parent,
                    tokens[start : start + span_tokens],
                    rest_extra if block else first_extra,
                )
                digests = get(key)
                if digests is None:
                    break
                out.extend(digests)
                parent = digests[-1]
                block += span
        cache.count(block, num_blocks - block)
        if block == num_blocks:
            return out
        # 2. Hash the rest (the hot loop: one serialisation and one SHA-256 per block).
        first_hashed = block
        blocks = [tokens[i : i + size] for i in range(block * size, num_blocks * size, size)]
        if block == 0 and first_extra != rest_extra:
            parent = hash_block(self.algo, parent, blocks[0], first_extra)
            out.append(parent)
            blocks = blocks[1:]
        sha = hashlib.sha256
        if self.algo == "sha256":
            dumps = pickle.dumps
            for tokens_of_block in blocks:
                parent = sha(dumps((parent, tokens_of_block, rest_extra), PICKLE_PROTOCOL)).digest()
                out.append(parent)
        else:
            cbor = cbor2.dumps
            for tokens_of_block in blocks:
                parent = sha(cbor((parent, tokens_of_block, rest_extra), canonical=True)).digest()
                out.append(parent)
        # 3. Remember every aligned span hashed by this call.
        if cache.capacity:
            for start_block in range(first_hashed, num_blocks - span + 1, span):
                start = start_block * size
                key = (
                    out[start_block - 1] if start_block else self.none_hash,
                    tokens[start : start + span_tokens],
                    rest_extra if start_block else first_extra,
                )
                cache.put(key, tuple(out[start_block : start_block + span]))
        return out

    def block_keys(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraKey | None = None,
        cache_salt: str | None = None,
        int_form: bool = False,
        known: Sequence[bytes] = (),
    ) -> list[BlockKey]:
        """Directory keys of every full block (``int_form``: 8-byte 64-bit keys); ``known`` as
        in ``hash_blocks`` (digests, never int-form keys)."""
        digests = self.hash_blocks(token_ids, lora=lora, cache_salt=cache_salt, known=known)
        if not int_form:
            return digests
        return [digest[-INT_KEY_SIZE:] for digest in digests]
