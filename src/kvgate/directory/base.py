"""The `BlockIndex` protocol: which pod of one pool holds which KV blocks.

One index serves one pool (all keys of a pool share a Redis hash tag). It stores *entries*: a
block key held by a pod, in a medium (vLLM's `medium`: "GPU" by default, "CPU" for offloaded
blocks). Two kinds of entries exist:

* **exact** entries come from the engine's own KV events (`add` / `remove`) and live until they
  are removed, the pod is cleared, its generation changes, or the per-pod cap evicts them. An
  engine may cache several blocks with the same hash (vLLM's `BlockPool` does when two requests
  compute one prefix at once) and then reports one `BlockStored` per copy and one
  `BlockRemoved` per evicted copy: an exact entry therefore counts its *copies* (per pod and
  medium, up to `MAX_COPIES`) and is held until as many removals as stores have arrived;
* **approximate** entries record where the router sent a prompt (routing history, for pools that
  publish no KV events, `add_approximate`); each expires `ttl_seconds` after it was last added.

Both kinds count as "held" for `lookup`. An exact entry is never downgraded by an approximate one.

Every pod carries a *generation* (an opaque string: pod UID + engine epoch). Changing it makes
all of the pod's previous entries vanish at once, without scanning the index, so a restarted
engine never routes on blocks it lost. Writers that still believe in the old generation are
ignored (see `add`).

Semantics shared by every backend (the conformance suite in tests/unit/directory checks them):

* pods are opaque non-empty strings; block keys are `bytes` (`kvgate.prefix.BlockKey`);
* a pod is *known* once it has a generation or an entry; `pods()` lists known pods;
* a medium is a non-empty string without "," or "*"; anything else is a ValueError;
* order of keys in `add`/`remove` does not matter; adding a key the pod holds in that medium
  adds a copy (also when the key repeats within one call), removing one drops a copy and the
  key stays held while a copy is left; removing an absent key (or more copies than were added)
  is a no-op; copies beyond `MAX_COPIES` are not counted; a key may be held in several media by
  the same pod, each with its own copies, and is held until it has been removed from every one
  of them; `clear_pod`, a new generation and the per-pod cap drop an entry with all its copies;
  approximate entries have no copies;
* every method is safe to call concurrently from many tasks (and, for Redis, processes).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvgate.prefix import BlockKey

#: The medium an entry is in when the event says nothing (vLLM leaves `medium` unset for GPU).
DEFAULT_MEDIUM = "GPU"

#: Per-pod caps every backend defaults to (docs/directory.md explains the sizing).
DEFAULT_MAX_BLOCKS_PER_POD = 1_000_000
DEFAULT_MAX_APPROXIMATE_PER_POD = 100_000

#: Approximate keys written in one step (`BlockIndex.add_approximate`): ~3 ms of work.
HISTORY_CHUNK_KEYS = 4096

#: Copies of one key a pod's medium counts (more stores are not counted, so a stream repeating a
#: `BlockStored` costs nothing more; vLLM holds a few copies at most, one per request that
#: computed the block at the same time). Docs: docs/directory.md, docs/security.md.
MAX_COPIES = 255


@dataclass(frozen=True, slots=True)
class IndexStats:
    """A point-in-time size of the index (for metrics and capacity planning)."""

    pods: int
    """Known pods."""
    entries: int
    """Exact (block, pod) entries; a block held by one pod in two media, or in several copies,
    counts once."""
    approximate_entries: int
    """Approximate (block, pod) entries, including expired ones not yet collected."""


@runtime_checkable
class BlockIndex(Protocol):
    """Which pod holds which prefix blocks of one pool."""

    async def lookup(
        self,
        keys: Sequence[BlockKey],
        pods: Collection[str] | None = None,
        *,
        medium: str | None = None,
    ) -> dict[str, int]:
        """For each pod, how many *leading* blocks of the chain `keys` it holds.

        - A pod's count is the largest `n` such that it holds `keys[0] .. keys[n-1]` (in any
          medium, exact or unexpired approximate). Holding `keys[5]` but not `keys[4]` does not
          extend a match: chained keys make a later block useless without its prefix.
        - The scan stops at the first block that no (remaining) pod holds, so the cost is
          bounded by the longest match, not by the chain length.
        - Pods with a count of 0 are absent from the result; an empty chain gives `{}`.
        - `pods`, when given, restricts the answer to those pods (unknown ones are ignored);
          `None` means every known pod.
        - Entries of a previous generation and expired approximate entries never count.
        - `medium`, when given, counts only blocks held in that medium (approximate entries,
          routing history of what a pod computed, count as `DEFAULT_MEDIUM`): e.g. how much of
          a match is on the GPU when the rest is in an offloading tier. It may cost more than a
          plain lookup (a scan per pod rather than one per 32 pods in Redis).
        """
        ...

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        """Record that `pod` holds every key of `keys` in `medium` (a KV `BlockStored`).

        - A key the pod already holds in `medium` gains a copy (at most `MAX_COPIES`), as does
          each repetition of a key within `keys`.
        - `generation=None` writes into whatever generation the pod has.
        - A pod without a generation adopts `generation` and the write applies.
        - A `generation` different from the pod's current one is a stale writer (an indexer that
          has not seen the restart yet): nothing is written and the call returns False.
        - If the pod then holds more than the backend's per-pod cap of exact entries, entries
          are evicted until it holds the cap (which ones is backend-defined: the bound on memory
          matters more than the choice, since an over-full pod has lost removal events anyway).
        - An approximate entry for the same key becomes exact (one copy).
        Returns True when the write applied.
        """
        ...

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        """Record that `pod` no longer holds `keys` in `medium` (a KV `BlockRemoved`).

        - Each key (each repetition too) drops one copy; a key with a copy left in `medium`, or
          held in another medium, stays held.
        - Removing a key the pod does not hold, or from an unknown pod, is a no-op.
        - Removes the pod's approximate entry for the key too, since the engine said it is gone.
        - `generation` follows the same rule as in `add` (a stale writer changes nothing;
          returns False), except that an unknown pod does not adopt it.
        """
        ...

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        """Record routing history: `pod` probably holds `keys` for the next `ttl_seconds`.

        - Re-adding a key refreshes its expiry to now + `ttl_seconds` (never shortens an exact
          entry, which has no expiry, and never adds a copy to one); an approximate entry has
          no copies: re-adding it is no second copy, one `remove` drops it.
        - Expired entries stop counting at once and are collected lazily.
        - Approximate entries per pod are capped like exact ones; the entries closest to expiry
          (the memory index: written longest ago) are evicted first. Of more `keys` than the
          cap, the first ones are kept (the head a lookup starts from).
        - The keys are written `HISTORY_CHUNK_KEYS` at a time (the memory index yields to the
          event loop between, Redis runs one script each), so a long prompt's history stalls
          neither; a lookup meanwhile may see part of it.
        - `ttl_seconds` must be > 0.
        """
        ...

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        """Drop every entry of `pod` (exact and approximate, all media) at once.

        The pod keeps its generation and stays known (a KV `AllBlocksCleared`); cost is O(its
        entries), never a scan of the whole index. Clearing an unknown pod is a no-op. With
        `generation`, only while it is the pod's (or the pod has none): a writer whose
        generation was superseded clears nothing of the new owner's.
        """
        ...

    async def forget_pod(self, pod: str) -> None:
        """`clear_pod` and drop the pod's generation: the pod is no longer known (pod deleted)."""
        ...

    async def set_generation(self, pod: str, generation: str) -> bool:
        """Make `generation` the pod's current generation.

        - If the pod had a different generation, every entry of that generation vanishes at once
          (as `clear_pod`) and True is returned.
        - A pod without a generation (unknown, or known only by generation-less writes) adopts
          it and keeps its entries; returns True.
        - Setting the current generation again changes nothing and returns False.
        - `generation` must be a non-empty string.
        """
        ...

    async def get_generation(self, pod: str) -> str | None:
        """The pod's current generation, or None if it never had one (or is unknown)."""
        ...

    async def owner_silent(self, pod: str, generation: str, seconds: float) -> bool:
        """True when the pod's current generation is another writer's (not `generation`, not
        none) and none of its writes (`add`, `remove` or `set_generation` of it) applied in
        the last `seconds`: that writer stopped, and a writer of `generation` that still
        receives the pod's events may take it over (`fallback.py`)."""
        ...

    async def pods(self) -> set[str]:
        """Every known pod (with a generation or at least one entry)."""
        ...

    async def audit(self, pods: Collection[str]) -> tuple[str, set[str]]:
        """The store's epoch and which of `pods` it does not know (O(len(pods))).

        The epoch is an opaque token that changes when the store lost its data (a Redis that
        restarted empty, or failed over to a replica that never had it): a router's writes
        raise nothing then (the client reconnects), and the first new write re-creates its
        pod with only that write's entries, so only the epoch tells that the rest is gone.
        """
        ...

    async def stats(self) -> IndexStats:
        """Counts of pods and entries (O(pods), not O(entries))."""
        ...

    async def close(self) -> None:
        """Release connections. The index must not be used afterwards; closing twice is fine."""
        ...


def check_pod(pod: str) -> None:
    """Raise ValueError unless `pod` is a non-empty string."""
    if not isinstance(pod, str) or not pod:
        raise ValueError(f"pod must be a non-empty string, got {pod!r}")


def check_medium(medium: str) -> None:
    """Raise ValueError unless `medium` is a non-empty string without ',' or '*' (the Redis
    backend's separators: `keys.py`)."""
    if not isinstance(medium, str) or not medium or "," in medium or "*" in medium:
        raise ValueError(f"medium must be a non-empty string without ',' or '*', got {medium!r}")


def check_generation(generation: str) -> None:
    """Raise ValueError unless `generation` is a non-empty string."""
    if not isinstance(generation, str) or not generation:
        raise ValueError(f"generation must be a non-empty string, got {generation!r}")


def check_caps(max_blocks_per_pod: int, max_approximate_per_pod: int) -> None:
    """Raise ValueError unless both per-pod caps are >= 1."""
    if max_blocks_per_pod < 1 or max_approximate_per_pod < 1:
        raise ValueError("per-pod caps must be >= 1")


def check_ttl(ttl_seconds: float) -> None:
    """Raise ValueError unless `ttl_seconds` is > 0 (NaN included)."""
    if not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds!r}")
