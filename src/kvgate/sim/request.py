"""A request inside the simulated engine: its tokens, block hashes, blocks and timeline.

Block hashes follow vLLM's ``Request.block_hashes``: one chained hash per full block of
``prompt + output`` tokens, extended as tokens are appended, with the request's ``cache_salt`` as
the extra key of block 0 only.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvgate.prefix import extra_keys_for_block

if TYPE_CHECKING:
    from kvgate.sim.lora import LoraModule


class BlockHasher(Protocol):
    """vLLM's ``hash_block_tokens`` for one pool configuration (algorithm and seed)."""

    def prompt_hashes(
        self, token_ids: Sequence[int], cache_salt: str | None, lora: LoraModule | None = None
    ) -> list[bytes]:
        """Hashes of every full block of a prompt."""
        ...

    def __call__(
        self, parent: bytes | None, tokens: Sequence[int], extra_keys: tuple[Any, ...] | None
    ) -> bytes:
        """One block chained from ``parent`` (``None`` for block 0)."""
        ...


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    """One generation request; the engine mutates its state as it schedules it."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float
    cache_salt: str | None = None
    lora: LoraModule | None = None
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    # Prompt tokens served from the prefix cache when the request was first scheduled (vLLM's
    # ``num_cached_tokens``, reported as ``usage.prompt_tokens_details.cached_tokens``).
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    prefill_done_time: float | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def extra_keys(self, block_index: int) -> tuple[Any, ...] | None:
        """The hash extra keys of a block: ``("lora", name, path)`` on every block of an
        adapter's request, then ``("cache_salt", salt)`` on block 0 only."""
        lora = self.lora.key if self.lora is not None else None
        return extra_keys_for_block(block_index, lora, self.cache_salt)

    def event_extra_keys(self, block_index: int) -> tuple[Any, ...] | None:
        """The untagged form of :meth:`extra_keys` published in KV events (vLLM's
        ``to_event_extra_keys``: the adapter name, the salt)."""
        keys = self.extra_keys(block_index)
        return None if keys is None else tuple(key[1] for key in keys)

    def update_block_hashes(self, hasher: BlockHasher, block_size: int) -> None:
        """Hash every full block of ``all_token_ids`` not hashed yet."""
        tokens = self.all_token_ids
        hashes = self.block_hashes
        if not hashes and len(tokens) >= 2 * block_size:
            hashes.extend(hasher.prompt_hashes(tokens, self.cache_salt, self.lora))
            return
        while (len(hashes) + 1) * block_size <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(
                hasher(parent, tokens[i * block_size : (i + 1) * block_size], self.extra_keys(i))
            )
