"""`BlockIndex` in Redis: shared by many router replicas and indexers.

Layout (`keys.py`): per pool a registry HASH pod -> generation; per pod a HASH of the block keys
it holds exactly (value: the media) and a ZSET of approximate entries scored by expiry. Every
operation is one Lua script (`redis_scripts.py`), hence one round trip and atomic (but a long
routing history is written, and a long chain looked up in one medium, `HISTORY_CHUNK_KEYS` keys
a script, so that no call holds Redis long):

* lookup probes each candidate pod's HASH with HMGET over growing chunks of the chain and drops
  a pod at its first missing block (see `redis_scripts.LOOKUP`);
* a new generation or a clear UNLINKs the pod's two keys: the old entries vanish at once and
  Redis frees them off its main thread; nothing ever SCANs or FLUSHes;
* memory is bounded by a per-pod cap on exact entries (random eviction over the cap: an
  over-full pod has missed removals and any victim is as good) and on approximate entries
  (soonest-expiring first), by collecting expired approximate entries on each write, and by a
  TTL on each approximate ZSET (an idle pool's routing history disappears entirely).

Connections (`RedisConnection`): one server (`redis://`, `rediss://` for TLS, optionally with a
CA bundle) or a Redis Cluster (`cluster=True`; the URL names any node, the client discovers the
others and follows slot moves and failovers). Every key of a pool shares its hash tag, so a
pool lives in one cluster slot and each script runs on the one master that owns it.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.maint_notifications import MaintNotificationsConfig

from kvgate.directory import redis_scripts
from kvgate.directory.base import (
    DEFAULT_MAX_APPROXIMATE_PER_POD,
    DEFAULT_MAX_BLOCKS_PER_POD,
    DEFAULT_MEDIUM,
    HISTORY_CHUNK_KEYS,
    IndexStats,
    check_caps,
    check_generation,
    check_medium,
    check_pod,
    check_ttl,
)
from kvgate.directory.keys import DEFAULT_PREFIX, PoolKeys
from kvgate.prefix import BlockKey

_Arg = str | bytes | int | float
Client = aioredis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class RedisConnection:
    """How to reach the directory's Redis (docs/directory.md, "Redis as deployed")."""

    url: str
    """redis://host:port/db, rediss:// for TLS, unix:///path; may carry user:password@ (then
    from a Secret)."""
    password: str | None = None
    """Overrides a password in the URL."""
    cluster: bool = False
    """Redis Cluster: `url` names any node (the database must be 0)."""
    ca_pem: str | None = None
    """PEM CA bundle that signs the server's certificate (rediss:// only); default: the system's
    trust store."""

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"Redis URL must be redis://, rediss:// or unix://, got {scheme!r}")
        if self.ca_pem is not None and scheme != "rediss":
            raise ValueError("a CA bundle needs a rediss:// (TLS) URL")
        if self.cluster and scheme == "unix":
            raise ValueError("a Redis Cluster is reached over TCP, not unix://")

    def client(self, socket_timeout_seconds: float | None) -> Client:
        """A new client (connection pool) for this connection."""
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout_seconds,
            "socket_connect_timeout": socket_timeout_seconds,
            "decode_responses": False,
            # redis-py's "maintenance notifications" (a managed-Redis feature kvgate does not
            # use) would add a handshake to every new connection.
            "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        }
        if self.password is not None:
            options["password"] = self.password
        if self.ca_pem is not None:
            options["ssl_ca_data"] = self.ca_pem
        if self.cluster:
            # The cluster client retries a failed node itself, after refreshing the slot map
            # (a promoted replica takes over); bounded so that a call gives up in about one
            # socket timeout per attempt, and the caller's local view answers.
            return RedisCluster.from_url(self.url, retry=Retry(NoBackoff(), 1), **options)
        # A pooled connection that Redis closed (restart, failover) is retried once on a
        # fresh one; timeouts are not retried: the caller's latency budget is spent.
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        return aioredis.Redis.from_url(self.url, retry=retry, **options)


EPOCH_TTL_SECONDS = 86_400
"""A pool's epoch key lives this long after its last audit (every router audits every 30 s):
a pool that is gone leaves nothing behind."""

MAX_STATS_PODS = 4096
"""Pods whose entries `stats` sums: a pool of more is broken or hostile (its count is still
exact)."""


def _counts(flat: list[Any]) -> dict[str, int]:
    """A lookup script's answer, `[pod, count, ...]`, as a dict."""
    return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def _packed(keys: Sequence[BlockKey]) -> list[_Arg]:
    """Keys as the scripts read them: `[size, concatenation]` when all have one size (one
    argument is far cheaper to encode and parse than thousands), else `[0, *keys]`."""
    sizes = set(map(len, keys))
    if len(sizes) == 1 and (size := sizes.pop()) > 0:
        return [size, b"".join(keys)]
    return [0, *keys]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisBlockIndex:
    """`BlockIndex` for one pool, stored in Redis under that pool's hash tag."""

    def __init__(
        self,
        client: Client,
        pool_key: str,
        *,
        key_prefix: str = DEFAULT_PREFIX,
        max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
        max_approximate_per_pod: int = DEFAULT_MAX_APPROXIMATE_PER_POD,
        clock: Callable[[], float] = time.time,
        owns_client: bool = False,
    ) -> None:
        check_caps(max_blocks_per_pod, max_approximate_per_pod)
        self._client = client
        self._owns_client = owns_client
        self._keys = PoolKeys.for_pool(pool_key, key_prefix)
        self._max_exact = max_blocks_per_pod
        self._max_approx = max_approximate_per_pod
        self._clock = clock
        self._lookup = client.register_script(redis_scripts.LOOKUP)
        self._lookup_medium = client.register_script(redis_scripts.LOOKUP_MEDIUM)
        self._add = client.register_script(redis_scripts.ADD)
        self._remove = client.register_script(redis_scripts.REMOVE)
        self._add_approximate = client.register_script(redis_scripts.ADD_APPROXIMATE)
        self._set_generation = client.register_script(redis_scripts.SET_GENERATION)
        self._owner_silent = client.register_script(redis_scripts.OWNER_SILENT)
        self._clear = client.register_script(redis_scripts.CLEAR)
        self._collect = client.register_script(redis_scripts.COLLECT)
        self._audit = client.register_script(redis_scripts.AUDIT)
        self._stats = client.register_script(redis_scripts.STATS)
        # redis-py 8.1's cluster client, first used by many tasks at once, loses connections
        # ("Connection closed by server", "'NoneType' object has no attribute 'writelines'")
        # while it reads the slot map: the index initialises it once, under a lock, first.
        self._uninitialised_cluster = isinstance(client, RedisCluster)
        self._initialising = asyncio.Lock()
        self._closed = False

    @classmethod
    def connect(
        cls,
        connection: RedisConnection,
        pool_key: str,
        *,
        socket_timeout_seconds: float | None = None,
        key_prefix: str = DEFAULT_PREFIX,
        max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
        max_approximate_per_pod: int = DEFAULT_MAX_APPROXIMATE_PER_POD,
        clock: Callable[[], float] = time.time,
    ) -> RedisBlockIndex:
        """An index owning a new client for `connection` (closed by `close`)."""
        return cls(
            connection.client(socket_timeout_seconds),
            pool_key,
            key_prefix=key_prefix,
            max_blocks_per_pod=max_blocks_per_pod,
            max_approximate_per_pod=max_approximate_per_pod,
            clock=clock,
            owns_client=True,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        pool_key: str,
        *,
        password: str | None = None,
        socket_timeout_seconds: float | None = None,
        key_prefix: str = DEFAULT_PREFIX,
        max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
        max_approximate_per_pod: int = DEFAULT_MAX_APPROXIMATE_PER_POD,
        clock: Callable[[], float] = time.time,
    ) -> RedisBlockIndex:
        """`connect` to one plain Redis server at `url`."""
        return cls.connect(
            RedisConnection(url, password=password),
            pool_key,
            socket_timeout_seconds=socket_timeout_seconds,
            key_prefix=key_prefix,
            max_blocks_per_pod=max_blocks_per_pod,
            max_approximate_per_pod=max_approximate_per_pod,
            clock=clock,
        )

    @property
    def keys(self) -> PoolKeys:
        return self._keys

    async def _ready(self) -> Client:
        if self._uninitialised_cluster:
            async with self._initialising:
                if self._uninitialised_cluster:
                    assert isinstance(self._client, RedisCluster)
                    await self._client.initialize()
                    self._uninitialised_cluster = False
        return self._client

    async def _run(self, script: AsyncScript, args: list[_Arg]) -> Any:
        await self._ready()
        # KEYS carries the registry only so that cluster clients route the call to the pool's
        # slot; the scripts derive the pool's other keys from ARGV[1] (same hash tag).
        return await script(keys=[self._keys.registry], args=[self._keys.base, *args])

    async def lookup(
        self,
        keys: Sequence[BlockKey],
        pods: Collection[str] | None = None,
        *,
        medium: str | None = None,
    ) -> dict[str, int]:
        if not keys or (pods is not None and not pods):
            return {}
        wanted = None if pods is None else sorted(set(pods))
        now = repr(float(self._clock()))
        if medium is not None:
            check_medium(medium)
            return await self._lookup_in_medium(keys, wanted, medium, now)
        head: list[_Arg] = [now, -1 if wanted is None else len(wanted), *(wanted or ())]
        return _counts(await self._run(self._lookup, [*head, *_packed(keys)]))

    async def _lookup_in_medium(
        self, keys: Sequence[BlockKey], pods: list[str] | None, medium: str, now: str
    ) -> dict[str, int]:
        """`lookup` in one medium: a script per `HISTORY_CHUNK_KEYS` keys, each asking only for
        the pods that held every key before it. The medium is read key by key for each pod (a
        string search, where the plain lookup ANDs bit masks): one script over a 65,536-block
        chain and 16 pods held redis-server, every router's call, 0.5 s."""
        counts: dict[str, int] = {}
        for start in range(0, len(keys), HISTORY_CHUNK_KEYS):
            chunk = keys[start : start + HISTORY_CHUNK_KEYS]
            head: list[_Arg] = [medium, int(medium == DEFAULT_MEDIUM), now]
            head += [-1] if pods is None else [len(pods), *pods]
            found = _counts(await self._run(self._lookup_medium, [*head, *_packed(chunk)]))
            counts.update({pod: start + n for pod, n in found.items()})
            pods = sorted(pod for pod, n in found.items() if n == len(chunk))
            if not pods:
                break
        return counts

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        check_pod(pod)
        check_medium(medium)
        head: list[_Arg] = [pod, generation or "", medium, self._max_exact]
        return bool(await self._run(self._add, [*head, *_packed(keys)]))

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        check_pod(pod)
        check_medium(medium)
        head: list[_Arg] = [pod, generation or "", medium]
        return bool(await self._run(self._remove, [*head, *_packed(keys)]))

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        check_pod(pod)
        check_ttl(ttl_seconds)
        now = float(self._clock())
        head: list[_Arg] = [
            pod,
            repr(now),
            repr(now + ttl_seconds),
            self._max_approx,
            math.ceil(ttl_seconds * 1000),
        ]
        if len(keys) > self._max_approx:  # the head: a longer history's rest would evict it
            keys = keys[: self._max_approx]
        slot: _Arg = ""  # the first chunk registers an unknown pod; the others need its slot
        for start in range(0, len(keys), HISTORY_CHUNK_KEYS):
            chunk = keys[start : start + HISTORY_CHUNK_KEYS]
            slot = await self._run(self._add_approximate, [*head, slot, *_packed(chunk)])
            if slot == -1:
                return  # forgotten meanwhile (it left): re-registering it would leak it

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        if await self._run(self._clear, [pod, 0, generation or ""]):
            await self.collect_garbage()

    async def forget_pod(self, pod: str) -> None:
        if await self._run(self._clear, [pod, 1, ""]):
            await self.collect_garbage()

    async def set_generation(self, pod: str, generation: str) -> bool:
        check_pod(pod)
        check_generation(generation)
        changed = bool(await self._run(self._set_generation, [pod, generation]))
        if changed:
            await self.collect_garbage()
        return changed

    async def owner_silent(self, pod: str, generation: str, seconds: float) -> bool:
        check_pod(pod)
        silence_ms = max(0, int(seconds * 1000))
        return bool(await self._run(self._owner_silent, [pod, generation, silence_ms]))

    async def collect_garbage(self) -> None:
        """Erase retired slots' bits from the forward index (bounded steps, until none left).

        Correctness never waits for this: a retired slot belongs to no pod, so its bits are
        ignored; this only returns the memory and the slot.
        """
        while await self._run(self._collect, [redis_scripts.GC_BUDGET]):
            pass

    async def get_generation(self, pod: str) -> str | None:
        value = await (await self._ready()).hget(self._keys.registry, pod)
        if value is None:
            return None
        generation = _text(value).partition("|")[2]  # "<slot>|<generation>"
        return generation or None

    async def pods(self) -> set[str]:
        return {_text(p) for p in await (await self._ready()).hkeys(self._keys.registry)}

    async def audit(self, pods: Collection[str]) -> tuple[str, set[str]]:
        # Set where missing: the first audit of a new (or emptied) store draws its epoch.
        token = secrets.token_hex(8)
        found = await self._run(self._audit, [token, EPOCH_TTL_SECONDS, *sorted(pods)])
        return _text(found[0]), {_text(p) for p in found[1:]}

    async def stats(self) -> IndexStats:
        """One script, whatever the registry holds: entries are summed over at most
        `MAX_STATS_PODS` pods (reading every pod's counts took 3.9 s of the event loop, every
        5 s, for a registry of 100,000 fields that anyone who can write Redis could add)."""
        pods, exact, approximate = await self._run(self._stats, [MAX_STATS_PODS])
        return IndexStats(pods=pods, entries=exact, approximate_entries=approximate)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()
