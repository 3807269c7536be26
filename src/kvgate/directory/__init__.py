"""The cache directory: which pod holds which prefix blocks, fed by vLLM KV events.

Public names are listed here once; see docs/directory.md for the semantics and Redis layout.
"""

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats
from kvgate.directory.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    KVEvent,
    decode_batch,
    encode_batch,
)
from kvgate.directory.factory import create_index
from kvgate.directory.indexer import SubscriptionManager
from kvgate.directory.instrumented import InstrumentedBlockIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.directory.redis import RedisBlockIndex
from kvgate.directory.subscriber import PodEndpoint, PodSubscriber

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
