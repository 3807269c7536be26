"""The cache directory: which pod holds which prefix blocks, fed by vLLM KV events.

Public names are listed here once; see docs/directory.md for the semantics and Redis layout.

The protocol (`base`) needs nothing beyond kvgate's base install; the backends, the KV-event
subscriber and the metrics need `redis`, `pyzmq`, `msgpack` and `prometheus-client` (the router
extra). Their names are imported on first use (PEP 562), so that the operator, which only
clears a deleted pool's entries through `kvgate.directory.redis`, does not need ZMQ or metrics.
"""

from typing import TYPE_CHECKING

from kvgate._lazy import lazy_names
from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats

if TYPE_CHECKING:
    from kvgate.directory.factory import create_index
    from kvgate.directory.indexer import SubscriptionManager
    from kvgate.directory.instrumented import InstrumentedBlockIndex
    from kvgate.directory.memory import MemoryBlockIndex
    from kvgate.directory.metrics import DirectoryMetrics
    from kvgate.directory.redis import RedisBlockIndex
    from kvgate.directory.subscriber import PodEndpoint, PodSubscriber
    from kvgate.kvevents import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        EventBatch,
        EventDecodeError,
        KVEvent,
        decode_batch,
        encode_batch,
    )

_EVENTS = (
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventDecodeError",
    "KVEvent",
    "decode_batch",
    "encode_batch",
)
_LAZY = {
    **dict.fromkeys(_EVENTS, "kvgate.kvevents"),
    "create_index": "kvgate.directory.factory",
    "SubscriptionManager": "kvgate.directory.indexer",
    "InstrumentedBlockIndex": "kvgate.directory.instrumented",
    "MemoryBlockIndex": "kvgate.directory.memory",
    "DirectoryMetrics": "kvgate.directory.metrics",
    "RedisBlockIndex": "kvgate.directory.redis",
    "PodEndpoint": "kvgate.directory.subscriber",
    "PodSubscriber": "kvgate.directory.subscriber",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "DEFAULT_MEDIUM",
    "AllBlocksCleared",
    "BlockIndex",
    "BlockRemoved",
    "BlockStored",
    "DirectoryMetrics",
    "EventBatch",
    "EventDecodeError",
    "IndexStats",
    "InstrumentedBlockIndex",
    "KVEvent",
    "MemoryBlockIndex",
    "PodEndpoint",
    "PodSubscriber",
    "RedisBlockIndex",
    "SubscriptionManager",
    "create_index",
    "decode_batch",
    "encode_batch",
]
