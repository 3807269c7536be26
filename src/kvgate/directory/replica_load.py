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


class ReplicaLoadBoard(ReplicaBoard):
    """One pool's exchange of replica loads (see the module docstring)."""

    def __init__(self, client: Client, pool_key: str, *, key_prefix: str = DEFAULT_PREFIX) -> None:
        key = PoolKeys.for_pool(pool_key, key_prefix).replica_load
        super().__init__(client, key, max_field_bytes=MAX_FIELD_BYTES)

    async def exchange(
        self, replica: str, loads: PodLoads, *, ttl_seconds: float, max_replicas: int
    ) -> dict[str, dict[str, PodLoad]]:
        """Publish this replica's loads; the other replicas' (fresh ones only)."""
        payload = json.dumps(
            {pod: list(load) for pod, load in loads.items()}, separators=(",", ":")
        )
        fields = await self.exchange_raw(
            replica, payload, ttl_seconds=ttl_seconds, max_replicas=max_replicas
        )
        out: dict[str, dict[str, PodLoad]] = {}
        for other, value in fields.items():
            parsed = _parse(value)
            if parsed is not None:
                out[other] = parsed
        return out


def _parse(value: bytes) -> dict[str, PodLoad] | None:
    if len(value) > MAX_FIELD_BYTES:
        return None
    try:
        data = untrusted_json.loads(value)
    except ValueError:  # nesting too deep included
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
