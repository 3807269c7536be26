"""The KV event types the simulator publishes: defined in `kvgate.kvevents`, named here for
`kvgate.bench.des` (simulator code imports `kvgate.kvevents` directly)."""

from kvgate.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent"]
