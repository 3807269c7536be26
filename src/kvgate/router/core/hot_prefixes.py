"""The prompt prefixes a pool's requests share most: what a pod that joins is warmed with.

Every routed request with exact keys (token ids known) offers a few of its prefixes, cut at
block boundaries: 1, 2, 4, 8, ... blocks (doubling up to the whole prompt) and the prefix the
chosen pod was predicted to hold (the boundary where requests really shared blocks: a system
prompt, a tool schema, a shared document). A prefix is named by its last block key, which
chains everything before it, the tenant's salt and the LoRA adapter, so one key is one prefix.

Two bounded tiers, both least-recently-seen first out:

- **candidates**: prefixes seen fewer than `min_requests` times; key and count only;
- **hot**: prefixes seen at least that often, with their token ids (4 bytes a token, bounded
  in bytes) so they can be sent again.

Counts decay exponentially (`half_life_seconds`), so yesterday's prompt layout fades. The
`top` prefixes of a pool are ranked by decayed count x tokens (the prefill a warm request saves
if each of those requests lands on the new pod); a prefix that starts another chosen one is
dropped (warming the longer caches its blocks too). Router replicas that share warm-ups add the
other replicas' counts of the same prefixes (`peer_prefixes.py`) to the ranking and to the
count that promotes a candidate (a prefix hot in the pool keeps its tokens the first time it
comes to this replica), and publish their own (`shared_counts`). A pool removed from the
configuration is forgotten (`forget_pool`). Plain synchronous code on the core's clock, like
the rest of the core.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from kvgate.api.fleet import WarmupConfig
from kvgate.router.core.keys import RequestKeys
from kvgate.router.core.peer_prefixes import PeerPrefixCounts
from kvgate.router.core.routing import RoutePlan

_TOKEN_BYTES = 4  # array("I")
_NONE: Mapping[bytes, float] = {}


@dataclass(slots=True)
class HotPrefix:
    """One shared prefix, as a warm request needs it."""

    pool: str
    model: str  # the model name its requests asked for (names the LoRA adapter, if any)
    tenant: str | None
    cache_salt: str | None
    key: bytes  # block key of its last block
    tokens: array[int] | None  # token ids (hot tier only)
    score: float  # requests seen, decayed to `seen_at`
    seen_at: float
    text: str | None = None  # a copy's text prompt, with approximate keys (`prefix_copies.py`)

    def decayed(self, now: float, half_life: float) -> float:
        return self.score * math.exp2(-(now - self.seen_at) / half_life)

    @property
    def token_count(self) -> int:
        return len(self.tokens) if self.tokens is not None else 0


class HotPrefixes:
    """Bounded memory of shared prefixes (see the module docstring). Not thread-safe."""

    def __init__(self, config: WarmupConfig, peers: PeerPrefixCounts | None = None) -> None:
        self.config = config
        self.peers = peers  # the other replicas' counts (shared warm-ups), else None
        self._candidates: OrderedDict[tuple[str, bytes], HotPrefix] = OrderedDict()
        self._hot: OrderedDict[tuple[str, bytes], HotPrefix] = OrderedDict()
        self.bytes = 0

    def configure(self, config: WarmupConfig) -> None:
        self.config = config
        self._trim()

    def __len__(self) -> int:
        return len(self._hot)

    def observe(self, plan: RoutePlan, now: float) -> None:
        """A request was routed: count the prefixes it offers."""
        keys = plan.keys
        tokens = keys.token_ids
        config = self.config
        if not config.enabled or tokens is None or not keys.exact or not keys.block_keys:
            return
        if keys.lookup is not None:
            # Its keys carry its cache ops: sent as a plain prompt, a copy would be stored under
            # keys no request of its session looks up (its plain head comes with other turns).
            return
        block = keys.block_tokens
        blocks = min(len(keys.block_keys), len(tokens) // block)
        first = max(1, -(-config.min_tokens // block))
        depths = set()
        depth = 1
        while depth <= blocks:
            if depth >= first:
                depths.add(depth)
            depth *= 2
        hit = min(plan.decision.predicted_hit_tokens // block, blocks)
        if hit >= first:
            depths.add(hit)
        cls = plan.classification
        pool = plan.pool.key
        peers = self.peers.counts(pool, now) if self.peers is not None else _NONE
        for depth in depths:
            self._seen(pool, cls.model, cls.tenant, cls.cache_salt, keys, depth, now, peers)
        self._trim()

    def _seen(
        self,
        pool: str,
        model: str,
        tenant: str | None,
        salt: str | None,
        keys: RequestKeys,
        depth: int,
        now: float,
        peers: Mapping[bytes, float],
    ) -> None:
        assert keys.token_ids is not None
        half_life = self.config.half_life_seconds
        name = (pool, keys.block_keys[depth - 1])
        entry = self._hot.get(name)
        if entry is not None:
            entry.score = entry.decayed(now, half_life) + 1.0
            entry.seen_at = now
            self._hot.move_to_end(name)
            return
        entry = self._candidates.get(name)
        if entry is None:
            entry = HotPrefix(pool, model, tenant, salt, name[1], None, 0.0, now)
            self._candidates[name] = entry
        entry.score = entry.decayed(now, half_life) + 1.0
        entry.seen_at = now
        self._candidates.move_to_end(name)
        # Promoted at `min_requests`, rounded: a decayed count never reaches it exactly (two
        # requests a second apart count 1.999), with the other replicas' requests: a prefix
        # hot in the pool is kept the first time it comes here, so whichever replica claims a
        # warm-up can send it.
        score = entry.score + peers.get(name[1], 0.0)
        if score + 0.5 >= self.config.min_requests and self.config.remembered_prefixes:
            tokens = token_array(keys.token_ids[: depth * keys.block_tokens])
            if tokens is None:
                return
            del self._candidates[name]
            entry.tokens = tokens
            self._hot[name] = entry
            self.bytes += entry.token_count * _TOKEN_BYTES

    def _trim(self) -> None:
        config = self.config
        while len(self._candidates) > config.candidate_prefixes:
            self._candidates.popitem(last=False)
        while self._hot and (
            len(self._hot) > config.remembered_prefixes or self.bytes > config.max_bytes
        ):
            _, entry = self._hot.popitem(last=False)
            self.bytes -= entry.token_count * _TOKEN_BYTES

    def forget_pool(self, pool: str) -> None:
        """Drop every prefix of `pool` (it left the configuration)."""
        for tier in (self._candidates, self._hot):
            for name in [name for name in tier if name[0] == pool]:
                entry = tier.pop(name)
                if tier is self._hot:
                    self.bytes -= entry.token_count * _TOKEN_BYTES

    def top(
        self,
        pool: str,
        n: int,
        now: float,
        *,
        model: str | None = None,
        tenant: str | None = None,
        any_tenant: bool = True,
        peer_counts: Mapping[bytes, float] | None = None,
    ) -> list[HotPrefix]:
        """The `n` prefixes of `pool` most worth warming (see the module docstring), optionally
        of one model and one tenant (`any_tenant=False`: only `tenant`'s, None = anonymous);
        `peer_counts`: the other replicas' requests per prefix key, added to this one's."""
        half_life = self.config.half_life_seconds
        peers = peer_counts or {}
        ranked = sorted(
            (
                e
                for e in self._entries(pool)
                if (model is None or e.model == model) and (any_tenant or e.tenant == tenant)
            ),
            key=lambda e: (e.decayed(now, half_life) + peers.get(e.key, 0.0)) * e.token_count,
            reverse=True,
        )
        chosen: list[HotPrefix] = []
        for entry in ranked:
            if len(chosen) >= n:
                break
            if any(_covers(other, entry) for other in chosen):
                continue
            # A longer prefix warms every shorter one it starts with: it takes their places.
            chosen = [other for other in chosen if not _covers(entry, other)]
            chosen.append(entry)
        return chosen

    def has(self, pool: str) -> bool:
        """Whether any prefix of `pool` is remembered with its tokens (could be warmed)."""
        return any(True for _ in self._entries(pool))

    def shared_counts(self, pool: str, n: int, now: float) -> dict[bytes, float]:
        """This replica's own requests per prefix key for its `n` hottest prefixes of `pool`
        (ranked as `top` ranks, shorter prefixes kept): what it publishes to the others."""
        half_life = self.config.half_life_seconds
        scored = sorted(
            ((e.decayed(now, half_life), e) for e in self._entries(pool)),
            key=lambda pair: pair[0] * pair[1].token_count,
            reverse=True,
        )
        return {e.key: count for count, e in scored[:n]}

    def _entries(self, pool: str) -> Iterator[HotPrefix]:
        return (e for (p, _), e in self._hot.items() if p == pool)


def token_array(ids: Sequence[int]) -> array[int] | None:
    """`ids` in 4 bytes each, as a remembered or copied prefix keeps them; None for a prompt
    with an id of 2^32 or more, which no vocabulary has (the pods refuse it)."""
    try:
        return array("I", ids)
    except OverflowError:
        return None


def _covers(longer: HotPrefix, shorter: HotPrefix) -> bool:
    """`longer` starts with all of `shorter` (same salt and model: the same chain)."""
    a, b = longer.tokens, shorter.tokens
    return (
        a is not None
        and b is not None
        and len(a) >= len(b)
        and longer.cache_salt == shorter.cache_salt
        and longer.model == shorter.model
        and a[: len(b)] == b
    )
