"""Every Redis key the directory writes, in one place.

All keys of one pool share the prefix and the hash tag `{<namespace>/<pool>}`, so that on Redis
Cluster they live in one slot and the multi-key Lua scripts of `redis_scripts.py` run there:

    <base> = <prefix>:{<namespace>/<pool>}:
    <base>pods        HASH  pod -> "<slot>|<generation>" (generation "" = none yet)
    <base>m:<word>    HASH  block key (raw bytes) -> mask (unsigned 32-bit) of slots 32*word.. holding it
    <base>x:<pod>     HASH  block key -> media ("GPU", "GPU,CPU", "GPU*2,CPU"): the pod's exact
                            entries; "*<n>" after a medium: n copies there (2 .. MAX_COPIES)
    <base>a:<pod>     ZSET  block key -> expiry (unix seconds): the pod's approximate entries
    <base>gc:<slot>   HASH  a cleared pod's former `x:` hash, erased from `m:` in bounded steps
    <base>gcq         LIST  slots waiting for that; <base>free LIST reusable slots
    <base>meta        HASH  next_slot
    <base>seen        HASH  pod -> Redis time (ms) its generation last wrote (`owner_silent`)
    <base>epoch       STRING a random token, set by the first audit that finds none (`fallback.py`;
                            TTL a day, renewed by each audit)
    <base>load        HASH  router replica -> "<redis ms>|<json loads>" (`replica_load.py`)
    <base>hot         HASH  router replica -> "<redis ms>|<json {block key hex: requests}>"
    <base>w:<pod>     STRING "<generation>|<w(arming)|d(one)>|<replica>": who warms the pod that
                      joined (TTL: its warm-up's timeout; then a short grace) (`shared_warmup.py`)

An `x:` value without "*" means one copy per medium, as every value did before copies were
counted, so data written by an older kvgate reads the same (an older reader's tier lookup,
during a rolling upgrade, misses a key with copies: a missed hit, never a false one).
`x:<pod>` is the pod's reverse index: clearing a pod renames it away (O(1)) and its entries
are reclaimed in O(its blocks) steps; nothing ever SCANs or FLUSHes. Pod names go into key
names verbatim: only the first `{...}` of a key decides its slot, and the `x:`/`a:`/`w:` marker
before the name keeps names unambiguous. The Lua scripts build these same names from `<base>`.
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

    @property
    def replica_load(self) -> str:
        return self.base + "load"

    @property
    def replica_hot(self) -> str:
        return self.base + "hot"

    def warm_claim(self, pod: str) -> str:
        return self.base + "w:" + pod

    def exact(self, pod: str) -> str:
        return self.base + "x:" + pod

    def approximate(self, pod: str) -> str:
        return self.base + "a:" + pod
