"""How often the other router replicas' requests shared each prefix: the pool's hot ranking.

Each replica sees only its share of a pool's traffic (a Service spreads connections), so its own
counts of shared prefixes are a noisy sample. The exchange (the live router's
`http/warm_sharing.py` over Redis, or the discrete-event bench in process) hands this object,
per pool, the other replicas' published counts (block key of a prefix's last block -> requests,
decayed) every `warmup.share_interval_seconds`; a replica that warms a joining pod ranks the
prefixes it knows by its own count plus these (`HotPrefixes.top(..., peer_counts=...)`). Only
keys and counts are shared: the token ids a warm request needs stay in the replica that saw
them, so a prefix is warmed by a replica that saw it itself, ranked by what all of them saw.

Each replica publishes the counts of its `SHARED_TOP_FACTOR` x `top_prefixes` hottest prefixes
(at most `MAX_SHARED_PREFIXES`). A pool's view older than `ttl_seconds` (three intervals) counts
nothing (Redis down, or the exchange stalled: the replica ranks by its own counts); a pool
removed from the configuration is forgotten (`forget_pool`). Plain synchronous code on the
core's clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.api.fleet import WarmupConfig
from kvgate.directory.shared_warmup import MAX_SHARED_PREFIXES

#: per replica id: block key -> requests (decayed to when it was published)
ReplicaCounts = Mapping[str, Mapping[bytes, float]]

#: the other replicas' published counts are used (and kept in Redis) this many intervals
SHARED_COUNTS_TTL_INTERVALS = 3.0
#: a replica publishes the counts of this many times `top_prefixes` of its hottest prefixes
SHARED_TOP_FACTOR = 4


def shared_counts_ttl_seconds(config: WarmupConfig) -> float:
    return SHARED_COUNTS_TTL_INTERVALS * config.share_interval_seconds


def shared_prefix_limit(config: WarmupConfig) -> int:
    """Prefixes whose counts a replica publishes per pool."""
    return min(MAX_SHARED_PREFIXES, SHARED_TOP_FACTOR * config.top_prefixes)


_EMPTY: Mapping[bytes, float] = {}


class PeerPrefixCounts:
    """The sum over the other replicas of their hot prefixes' counts, per pool, with its age."""

    def __init__(self, ttl_seconds: float = 15.0) -> None:
        self.ttl_seconds = ttl_seconds
        self._pools: dict[str, tuple[dict[bytes, float], float, int]] = {}  # sum, at, replicas

    def update(self, pool: str, replicas: ReplicaCounts, now: float) -> None:
        """A fresh view of every other replica's counts for `pool` (replaces the previous)."""
        total: dict[bytes, float] = {}
        for counts in replicas.values():
            for key, count in counts.items():
                total[key] = total.get(key, 0.0) + count
        self._pools[pool] = (total, now, len(replicas))

    def counts(self, pool: str, now: float) -> Mapping[bytes, float]:
        """The others' summed counts for `pool` ({} when none are known or the view is stale)."""
        found = self._pools.get(pool)
        if found is None or now - found[1] > self.ttl_seconds:
            return _EMPTY
        return found[0]

    def replicas(self, pool: str, now: float) -> int:
        """Other replicas in `pool`'s view (0 when it is stale)."""
        found = self._pools.get(pool)
        return 0 if found is None or now - found[1] > self.ttl_seconds else found[2]

    def forget_pool(self, pool: str) -> None:
        """Drop `pool`'s view (it left the configuration)."""
        self._pools.pop(pool, None)
