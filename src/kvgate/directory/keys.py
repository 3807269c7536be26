"""Every Redis key the directory writes, in one place.

All keys of one pool share the prefix and the hash tag `{<namespace>/<pool>}`, so that on Redis
Cluster they live in one slot and the multi-key Lua scripts of `redis.py` run there:

    <prefix>:{<namespace>/<pool>}:pods          HASH  pod -> generation ("" = none yet)
    <prefix>:{<namespace>/<pool>}:x:<pod>       HASH  block key (raw bytes) -> media ("GPU,CPU")
    <prefix>:{<namespace>/<pool>}:a:<pod>       ZSET  block key -> expiry (unix ms), approximate

The `x:` hash is the pod's reverse index (clearing a pod deletes it: O(its blocks), with UNLINK
freeing memory off the main thread) and also what `lookup` probes (HMGET of a chain's keys).
Pod names go into key names verbatim: only the first `{...}` of a key decides its slot, and the
`x:`/`a:` marker before the pod name keeps names unambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "kvgate"


def _check_component(what: str, value: str) -> None:
    if not value or any(c in value for c in "{}") or any(ord(c) < 32 for c in value):
        raise ValueError(f"{what} must be non-empty, without braces or control chars: {value!r}")


@dataclass(frozen=True, slots=True)
class PoolKeys:
    """Key names for one pool."""

    base: str  # "<prefix>:{<namespace>/<pool>}:"

    @classmethod
    def for_pool(cls, pool_key: str, prefix: str = DEFAULT_PREFIX) -> PoolKeys:
        """`pool_key` is `<namespace>/<pool>` (kvgate.api's `PoolConfig.key`)."""
        _check_component("key prefix", prefix)
        _check_component("pool key", pool_key)
        return cls(base=f"{prefix}:{{{pool_key}}}:")

    @property
    def registry(self) -> str:
        return self.base + "pods"

    def exact(self, pod: str) -> str:
        return self.base + "x:" + pod

    def approximate(self, pod: str) -> str:
        return self.base + "a:" + pod

    # The lookup script builds the per-pod names itself (it learns the pods inside Redis):
    EXACT_MARKER = "x:"
    APPROXIMATE_MARKER = "a:"
