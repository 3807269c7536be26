"""Router replicas' load on each pod, exchanged through Redis (one round trip per pool).

    <base>load   HASH  replica id -> "<Redis time, ms>|<JSON {pod: [in_flight, pending_requests,
                                                                 pending_tokens, batch_in_flight]}>"

`exchange(replica, loads)` runs one Lua script: it stamps this replica's field with Redis' own
clock (so replicas' clocks never need to agree), deletes the fields older than the TTL (replicas
that stopped), and returns every other replica's field, at most `max_replicas` of them. The
hash itself expires ten TTLs after the last write, so a pool no router serves leaves nothing.
A field over `MAX_FIELD_BYTES` is not sent back (an exchange reads at most `max_replicas` of
them), and what comes back is checked: a field that is not the expected JSON, or a count that
is not a non-negative integer below 2^31, is dropped (Redis is shared; a bad writer must not
break routing). A list of three counts (a replica from before batch requests were counted
apart) reads as no batch request. Keys: `keys.PoolKeys.replica_load`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from kvgate.directory.keys import DEFAULT_PREFIX, PoolKeys
from kvgate.directory.redis import Client

#: per pod id: (in flight, pending prefill requests, pending prefill tokens, batch in flight)
PodLoad = tuple[int, int, int, int]
PodLoads = Mapping[str, PodLoad]

_MAX_COUNT = 1 << 31
MAX_FIELD_BYTES = 1 << 20  # one replica's loads of one pool (~40 bytes a pod)

EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], now .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 10)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
local limit = tonumber(ARGV[4])
local max_bytes = tonumber(ARGV[5])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local sep = string.find(value, '|', 1, true)
  local at = sep and tonumber(string.sub(value, 1, sep - 1)) or nil
  if not at or now - at > ttl then
    redis.call('HDEL', KEYS[1], field)
  elseif field ~= ARGV[1] and #out < 2 * limit and #value - sep <= max_bytes then
    out[#out + 1] = field
    out[#out + 1] = string.sub(value, sep + 1)
  end
end
return out
"""


class ReplicaLoadBoard:
    """One pool's exchange of replica loads (see the module docstring)."""

    def __init__(self, client: Client, pool_key: str, *, key_prefix: str = DEFAULT_PREFIX) -> None:
        self.key = PoolKeys.for_pool(pool_key, key_prefix).replica_load
        self._script = client.register_script(EXCHANGE)

    async def exchange(
        self, replica: str, loads: PodLoads, *, ttl_seconds: float, max_replicas: int
    ) -> dict[str, dict[str, PodLoad]]:
        """Publish this replica's loads; the other replicas' (fresh ones only)."""
        payload = json.dumps(
            {pod: list(load) for pod, load in loads.items()}, separators=(",", ":")
        )
        ttl_ms = max(1, round(ttl_seconds * 1000))
        raw = await self._script(
            keys=[self.key], args=[replica, payload, ttl_ms, max_replicas, MAX_FIELD_BYTES]
        )
        out: dict[str, dict[str, PodLoad]] = {}
        for i in range(0, len(raw) - 1, 2):
            parsed = _parse(raw[i + 1])
            if parsed is not None:
                out[raw[i].decode("utf-8", "replace")] = parsed
        return out


def _parse(value: bytes) -> dict[str, PodLoad] | None:
    if len(value) > MAX_FIELD_BYTES:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    out = {}
    for pod, load in data.items():
        if (
            isinstance(load, list)
            and len(load) in (3, 4)
            and all(type(n) is int and 0 <= n < _MAX_COUNT for n in load)
        ):
            out[pod] = (load[0], load[1], load[2], load[3] if len(load) == 4 else 0)
    return out
