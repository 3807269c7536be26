"""What router replicas share so that a pod that joins is warmed once, with the pool's prefixes.

    <base>hot     HASH    replica id -> "<Redis ms>|<JSON {block key hex: requests}>"
    <base>w:<pod> STRING  "<generation>|<state>|<replica>"   state: w (warming) | d (done)

**Hot prefixes** (`HotPrefixBoard`): every few seconds each replica publishes, per pool, the
request counts of its hottest prefixes (a prefix is named by its last block key, which chains
the salt and adapter; no token ids: Redis never holds prompt text) and reads the other
replicas' in the same round trip (`replica_board.ReplicaBoard`: fields stamped with Redis'
clock, stale ones deleted). What comes back is checked: at most `MAX_SHARED_PREFIXES` entries a
replica, keys of 1 to 64 bytes, counts finite and within [0, 1e9]; anything else is dropped.

**Claims** (`RedisWarmClaims`, one Lua script each, atomic): `claim` takes a pod's warm-up for
this replica unless another replica holds it for the same pod generation (then the answer says
whether that one is warming or done); a replica with nothing to warm takes nothing. The claim
lives `ttl_seconds` (the warm-up's timeout); `done` marks it done and keeps it `grace_seconds`
longer, for replicas that hear of the pod late; `states` reads the claims a replica follows.
A claim of another generation (the pod was replaced) is taken over; one of this replica's own
(the pod left and came back) is taken again. `MemoryWarmClaims` is the same in process (the
discrete-event bench, tests); one conformance test runs both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Literal

from kvgate import untrusted_json
from kvgate.directory.keys import DEFAULT_PREFIX, PoolKeys
from kvgate.directory.redis import Client
from kvgate.directory.replica_board import ReplicaBoard

#: the answer to a claim: this replica warms the pod; another does (follow it); another did;
#: nobody does and this replica has nothing to warm it with
ClaimOutcome = Literal["claimed", "follow", "done", "nothing"]
#: a followed claim: still warming; done; gone (expired, or the pod's generation changed)
ClaimState = Literal["warming", "done", "gone"]

MAX_SHARED_PREFIXES = 1024  # entries of one replica's published counts, per pool
MAX_HOT_FIELD_BYTES = 256 << 10  # ~100 bytes an entry
MAX_HOT_ROUND_BYTES = 2 << 20  # read in one exchange, parsed on the event loop (~20 ms)
MAX_KEY_BYTES = 64  # block keys are 32 (sha256) or 16 bytes
MAX_COUNT = 1e9
MAX_CLAIM_BYTES = 1024  # a claim's value; a longer one is no claim

# A claim's value, "<generation>|<state>|<replica>": its three parts, or nil when it is not a
# claim (missing, too long, malformed): shared by the scripts that read claims.
_PARSE_CLAIM = """
local function parse(value)
  if not value or #value > MAX_CLAIM_BYTES then return nil end
  local a = string.find(value, '|', 1, true)
  local b = a and string.find(value, '|', a + 1, true)
  if not b then return nil end
  local state = string.sub(value, a + 1, b - 1)
  if state ~= 'w' and state ~= 'd' then return nil end
  return string.sub(value, 1, a - 1), state, string.sub(value, b + 1)
end
""".replace("MAX_CLAIM_BYTES", str(MAX_CLAIM_BYTES))

_CLAIM = (
    _PARSE_CLAIM
    + """
local gen, state, owner = parse(redis.call('GET', KEYS[1]))
if gen == ARGV[2] and owner ~= ARGV[1] then
  return {state, owner}
end
if ARGV[3] ~= '1' then
  return {'n', ''}
end
redis.call('SET', KEYS[1], ARGV[2] .. '|w|' .. ARGV[1], 'PX', ARGV[4])
return {'c', ARGV[1]}
"""
)

_DONE = """
if redis.call('GET', KEYS[1]) == ARGV[2] .. '|w|' .. ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2] .. '|d|' .. ARGV[1], 'PX', ARGV[3])
  return 1
end
return 0
"""

_STATES = (
    _PARSE_CLAIM
    + """
local out = {}
for i, key in ipairs(KEYS) do
  local gen, state = parse(redis.call('GET', key))
  out[i] = (gen == ARGV[i]) and state or 'g'
end
return out
"""
)

_OUTCOMES: dict[bytes, ClaimOutcome] = {
    b"c": "claimed",
    b"w": "follow",
    b"d": "done",
    b"n": "nothing",
}
_STATE_NAMES: dict[bytes, ClaimState] = {b"w": "warming", b"d": "done", b"g": "gone"}


def _generation(generation: str) -> str:
    # '|' separates the value's fields; a generation never needs one (pod UID, "static", IP).
    return generation.replace("|", "/")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisWarmClaims:
    """One pool's warm-up claims in Redis (see the module docstring)."""

    def __init__(self, client: Client, pool_key: str, *, key_prefix: str = DEFAULT_PREFIX) -> None:
        self.keys = PoolKeys.for_pool(pool_key, key_prefix)
        self._claim = client.register_script(_CLAIM)
        self._done = client.register_script(_DONE)
        self._states = client.register_script(_STATES)

    async def claim(
        self, pod: str, generation: str, replica: str, *, can_warm: bool, ttl_seconds: float
    ) -> tuple[ClaimOutcome, str]:
        """(outcome, the replica warming the pod: this one, another, or "" for nobody)."""
        raw = await self._claim(
            keys=[self.keys.warm_claim(pod)],
            args=[replica, _generation(generation), "1" if can_warm else "0", _ms(ttl_seconds)],
        )
        outcome = _OUTCOMES.get(raw[0]) if isinstance(raw, list) and len(raw) == 2 else None
        if outcome is None:
            raise ValueError(f"unexpected claim answer {raw!r}")
        return outcome, raw[1][:MAX_CLAIM_BYTES].decode("utf-8", "replace")

    async def done(self, pod: str, generation: str, replica: str, *, grace_seconds: float) -> bool:
        """Mark this replica's claim done (False: it is not this replica's any more)."""
        key = self.keys.warm_claim(pod)
        args = (replica, _generation(generation), _ms(grace_seconds))
        return bool(await self._done(keys=[key], args=args))

    async def states(self, pods: list[tuple[str, str]]) -> list[ClaimState]:
        """The state of each (pod, generation)'s claim, in order."""
        if not pods:
            return []
        keys = [self.keys.warm_claim(pod) for pod, _ in pods]
        raw = await self._states(keys=keys, args=[_generation(g) for _, g in pods])
        return [_STATE_NAMES.get(state, "gone") for state in raw]


class MemoryWarmClaims:
    """`RedisWarmClaims` in process, on an injected clock (the discrete-event bench, tests)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._claims: dict[
            str, tuple[str, str, str, float]
        ] = {}  # pod -> (gen, state, owner, until)

    def _get(self, pod: str) -> tuple[str, str, str, float] | None:
        found = self._claims.get(pod)
        if found is not None and found[3] <= self._clock():
            del self._claims[pod]
            return None
        return found

    async def claim(
        self, pod: str, generation: str, replica: str, *, can_warm: bool, ttl_seconds: float
    ) -> tuple[ClaimOutcome, str]:
        generation = _generation(generation)
        found = self._get(pod)
        if found is not None and found[0] == generation and found[2] != replica:
            return ("follow" if found[1] == "w" else "done"), found[2]
        if not can_warm:
            return "nothing", ""
        self._claims[pod] = (generation, "w", replica, self._clock() + _ms(ttl_seconds) / 1000)
        return "claimed", replica

    async def done(self, pod: str, generation: str, replica: str, *, grace_seconds: float) -> bool:
        found = self._get(pod)
        if found is None or found[:3] != (_generation(generation), "w", replica):
            return False
        self._claims[pod] = (found[0], "d", replica, self._clock() + _ms(grace_seconds) / 1000)
        return True

    async def states(self, pods: list[tuple[str, str]]) -> list[ClaimState]:
        out: list[ClaimState] = []
        for pod, generation in pods:
            found = self._get(pod)
            if found is None or found[0] != _generation(generation):
                out.append("gone")
            else:
                out.append("warming" if found[1] == "w" else "done")
        return out


class HotPrefixBoard(ReplicaBoard):
    """One pool's exchange of hot-prefix request counts (see the module docstring)."""

    def __init__(self, client: Client, pool_key: str, *, key_prefix: str = DEFAULT_PREFIX) -> None:
        key = PoolKeys.for_pool(pool_key, key_prefix).replica_hot
        super().__init__(
            client, key, max_field_bytes=MAX_HOT_FIELD_BYTES, max_round_bytes=MAX_HOT_ROUND_BYTES
        )

    async def exchange(
        self,
        replica: str,
        counts: Mapping[bytes, float],
        *,
        ttl_seconds: float,
        max_replicas: int,
    ) -> dict[str, dict[bytes, float]]:
        """Publish this replica's counts (the first `MAX_SHARED_PREFIXES`); the others'."""
        payload = encode_counts(counts)
        fields = await self.exchange_raw(
            replica, payload, ttl_seconds=ttl_seconds, max_replicas=max_replicas
        )
        return {other: parse_counts(value) for other, value in fields.items()}


def encode_counts(counts: Mapping[bytes, float]) -> str:
    items = list(counts.items())[:MAX_SHARED_PREFIXES]
    return json.dumps({key.hex(): round(count, 3) for key, count in items}, separators=(",", ":"))


def parse_counts(value: bytes) -> dict[bytes, float]:
    """A replica's published counts, checked (see the module docstring); {} if unreadable."""
    if len(value) > MAX_HOT_FIELD_BYTES:
        return {}
    try:
        data = untrusted_json.loads(value)
    except ValueError:  # nesting too deep included
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[bytes, float] = {}
    for name, count in data.items():
        if len(out) >= MAX_SHARED_PREFIXES:
            break
        # Type and range only, never arithmetic: NaN fails the comparison, and an integer of
        # any size compares exactly (math.isfinite(10**400) would raise OverflowError).
        if type(count) not in (int, float) or not 0 <= count <= MAX_COUNT:
            continue
        if not 2 <= len(name) <= 2 * MAX_KEY_BYTES:
            continue
        try:
            key = bytes.fromhex(name)
        except ValueError:
            continue
        if 2 * len(key) == len(name):  # fromhex skips whitespace: hex digits only
            out[key] = float(count)
    return out
