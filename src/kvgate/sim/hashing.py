"""Block hashing for the simulated engine, delegated to :mod:`kvgate.prefix` (never redone here).

The engine hashes a prompt's full blocks at once when the request arrives (the prefix package's
chain cache makes repeated prefixes cheap) and then one block at a time as generated tokens fill
blocks, exactly as vLLM's ``Request.block_hashes`` grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvgate.prefix import BlockHasher, HashAlgo, hash_block
from kvgate.sim.lora import LoraModule


class PrefixBlockHasher:
    """vLLM's chained block hash for one engine configuration (algorithm, block size, seed)."""

    def __init__(self, algo: HashAlgo, block_size: int, seed: str | None) -> None:
        self._chain = BlockHasher(algo, block_size, seed)
        self.algo: HashAlgo = algo
        self.block_size = block_size
        self.none_hash = self._chain.none_hash

    def prompt_hashes(
        self, token_ids: Sequence[int], cache_salt: str | None, lora: LoraModule | None = None
    ) -> list[bytes]:
        """Hashes of every full block of a prompt."""
        key = lora.key if lora is not None else None
        return self._chain.hash_blocks(token_ids, lora=key, cache_salt=cache_salt)

    def __call__(
        self, parent: bytes | None, tokens: Sequence[int], extra_keys: tuple[Any, ...] | None
    ) -> bytes:
        """One block chained from ``parent`` (``None`` for block 0)."""
        return hash_block(
            self.algo, self.none_hash if parent is None else parent, tokens, extra_keys
        )
