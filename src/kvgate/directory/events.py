"""The KV event decoder the directory applies: defined in `kvgate.kvevents`, named here too.

`kvgate.kvevents` holds the one definition of vLLM's event types, their encoder (the
simulator publishes with it) and their decoder; this module keeps the directory's import path.
"""

from kvgate.kvevents import (
    HASH_SIZES,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    KVEvent,
    RejectedEvent,
    decode_batch,
    directory_keys,
    encode_batch,
    event_to_json,
)

__all__ = [
    "HASH_SIZES",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventDecodeError",
    "KVEvent",
    "RejectedEvent",
    "decode_batch",
    "directory_keys",
    "encode_batch",
    "event_to_json",
]
