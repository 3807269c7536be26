"""Router replicas' load on each pod, exchanged through Redis (one round trip per pool).

    <base>load   HASH  replica id -> "<Redis time, ms>|<JSON {pod: [in_flight, pending_requests,
                                                                 pending_tokens, batch_in_flight]}>"

`exchange(replica, loads)` is one `replica_board.ReplicaBoard` exchange: this replica's field
stamped with Redis' clock, fields older than the TTL deleted, every other replica's field
returned (at most `max_replicas`, none over `MAX_FIELD_BYTES`). What comes back is checked: a
field that is not the expected JSON, or a count that is not a non-negative integer below 2^31,
is dropped (Redis is shared; a bad writer must not break routing). A list of three counts (a
replica from before batch requests were counted apart) reads as no batch request. Keys:
`keys.PoolKeys.replica_load`.

What is parsed is bounded by the pods this replica knows, since the exchange runs on the event
loop every 20 ms: a field longer than `FIELD_BYTES_PER_POD` a known pod is not even fetched, one
round reads at most `MAX_ROUND_BYTES`, and only known pods' loads are kept (64 fields of 54
KiB that a bad writer kept in Redis held the loop 117 ms a round, 2.6 s of every 3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from kvgate import untrusted_json
from kvgate.directory.keys import DEFAULT_PREFIX, PoolKeys
from kvgate.directory.redis import Client
from kvgate.directory.replica_board import ReplicaBoard

#: per pod id: (in flight, pending prefill requests, pending prefill tokens, batch in flight)
PodLoad = tuple[int, int, int, int]
PodLoads = Mapping[str, PodLoad]

_MAX_COUNT = 1 << 31
MAX_FIELD_BYTES = 1 << 20  # one replica's loads of one pool (~40 bytes a pod)
FIELD_BYTES_PER_POD = 512  # a pod id of up to ~450 characters and its four counts
MAX_ROUND_BYTES = 1 << 20  # parsed in one exchange (~5 ms)


class ReplicaLoadBoard(ReplicaBoard):
    """One pool's exchange of replica loads (see the module docstring)."""

    def __init__(self, client: Client, pool_key: str, *, key_prefix: str = DEFAULT_PREFIX) -> None:
        key = PoolKeys.for_pool(pool_key, key_prefix).replica_load
        super().__init__(
            client, key, max_field_bytes=MAX_FIELD_BYTES, max_round_bytes=MAX_ROUND_BYTES
        )

    async def exchange(
        self, replica: str, loads: PodLoads, *, ttl_seconds: float, max_replicas: int
    ) -> dict[str, dict[str, PodLoad]]:
        """Publish this replica's loads; the other replicas' (fresh ones only)."""
        payload = json.dumps(
            {pod: list(load) for pod, load in loads.items()}, separators=(",", ":")
        )
        fields = await self.exchange_raw(
            replica,
            payload,
            ttl_seconds=ttl_seconds,
            max_replicas=max_replicas,
            max_field_bytes=64 + FIELD_BYTES_PER_POD * len(loads),
        )
        out: dict[str, dict[str, PodLoad]] = {}
        for other, value in fields.items():
            parsed = _parse(value, loads)
            if parsed is not None:
                out[other] = parsed
        return out


def _parse(value: bytes, known: Mapping[str, object]) -> dict[str, PodLoad] | None:
    """A field's loads of the `known` pods; None if it is not a field's JSON."""
    try:
        data = untrusted_json.loads(value)
    except ValueError:  # nesting too deep included
        return None
    if not isinstance(data, dict):
        return None
    out = {}
    for pod, load in data.items():
        if (
            pod in known
            and isinstance(load, list)
            and len(load) in (3, 4)
            and all(type(n) is int and 0 <= n < _MAX_COUNT for n in load)
        ):
            out[pod] = (load[0], load[1], load[2], load[3] if len(load) == 4 else 0)
    return out
