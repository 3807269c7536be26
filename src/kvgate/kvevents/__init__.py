"""vLLM KV cache events: the wire types, the encoder the simulator publishes with and the
decoder the directory applies, defined once (a leaf: it imports only `kvgate.prefix`).

Public names are listed here once; see docs/directory.md for how the indexer applies them.
"""

from kvgate.kvevents.decode import HASH_SIZES, EventDecodeError, decode_batch, event_to_json
from kvgate.kvevents.encode import encode_batch, external_hash
from kvgate.kvevents.events import (
    FULL_ATTENTION_KINDS,
    KIND_FULL_ATTENTION,
    MEDIUM_CPU,
    MEDIUM_GPU,
    REMOVED_FIELDS,
    STORED_FIELDS,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    RejectedEvent,
    directory_keys,
)

__all__ = [
    "FULL_ATTENTION_KINDS",
    "HASH_SIZES",
    "KIND_FULL_ATTENTION",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "REMOVED_FIELDS",
    "STORED_FIELDS",
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
    "external_hash",
]
