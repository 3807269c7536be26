"""A field per router replica in one Redis hash: write mine, read the others', one round trip.

    <hash>   HASH  replica id -> "<Redis time, ms>|<payload>"

`exchange(replica, payload)` runs one Lua script: it stamps this replica's field with Redis' own
clock (so replicas' clocks never need to agree), deletes the fields older than the TTL (replicas
that stopped), and returns every other replica's payload, at most `max_replicas` of them and
none over the board's `max_field_bytes` or the caller's tighter bound (a bad writer cannot make
a reader fetch more), and of those only as many as `max_round_bytes` hold in all: the caller
parses them on the event loop. The hash expires ten TTLs after the last write, so a pool no
router serves leaves nothing. What a payload means, and checking it, is the caller's
(`replica_load.py`, `shared_warmup.py`): Redis is shared, and a bad writer must not break
routing.
"""

from __future__ import annotations

from kvgate.directory.redis import Client

MAX_REPLICA_ID_BYTES = 256
"""A replica's id (its pod name and a random suffix) is short: a longer field name is a bad
writer's, deleted unread (64 fields of 1 MiB names cost a reader 64 MiB a round)."""

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
  if not at or now - at > ttl or #field > MAX_ID_BYTES then
    redis.call('HDEL', KEYS[1], field)
  elseif field ~= ARGV[1] and #out < 2 * limit and #value - sep <= max_bytes then
    out[#out + 1] = field
    out[#out + 1] = string.sub(value, sep + 1)
  end
end
return out
""".replace("MAX_ID_BYTES", str(MAX_REPLICA_ID_BYTES))


class ReplicaBoard:
    """One hash of per-replica fields (see the module docstring)."""

    def __init__(
        self, client: Client, key: str, *, max_field_bytes: int, max_round_bytes: int
    ) -> None:
        self.key = key
        self.max_field_bytes = max_field_bytes
        self.max_round_bytes = max_round_bytes
        self._script = client.register_script(EXCHANGE)

    async def exchange_raw(
        self,
        replica: str,
        payload: str,
        *,
        ttl_seconds: float,
        max_replicas: int,
        max_field_bytes: int | None = None,
    ) -> dict[str, bytes]:
        """Publish this replica's payload; the other replicas' fresh ones, by replica id, each
        at most `max_field_bytes` (the board's if None or more) and `max_round_bytes` in all."""
        ttl_ms = max(1, round(ttl_seconds * 1000))
        longest = self.max_field_bytes
        if max_field_bytes is not None:
            longest = min(longest, max_field_bytes)
        raw = await self._script(
            keys=[self.key], args=[replica, payload, ttl_ms, max_replicas, longest]
        )
        out: dict[str, bytes] = {}
        budget = self.max_round_bytes
        for i in range(0, len(raw) - 1, 2):
            name, value = raw[i], raw[i + 1]
            if len(value) <= longest and len(value) + len(name) <= budget:
                budget -= len(value) + len(name)
                out[name.decode("utf-8", "replace")] = value
        return out
