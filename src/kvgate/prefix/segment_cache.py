"""The tokenizer's segment cache: piece text → its ids, an LRU bounded in bytes.

An entry costs ``sys.getsizeof`` of the text and of the ids tuple plus a fixed overhead (the
ids are canonical ``int`` objects shared by every entry, so a token costs its 8-byte slot);
entries over an eighth of the budget are not kept, so that one huge piece cannot flush
everything else. Safe for concurrent use: a lock held only around each dictionary update.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

_ENTRY_OVERHEAD = 120  # an OrderedDict entry: hash slot, key/value references, list links


class SegmentCache:
    """Piece text → its (canonical) ids; an LRU bounded in bytes, safe across threads."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("segment cache budget must be >= 0 bytes")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def entry_bytes(piece: str, ids: tuple[int, ...]) -> int:
        return sys.getsizeof(piece) + sys.getsizeof(ids) + _ENTRY_OVERHEAD

    def get(self, piece: str) -> tuple[int, ...] | None:
        with self._lock:
            ids = self._entries.get(piece)
            if ids is None:
                self.misses += 1
                return None
            self._entries.move_to_end(piece)
            self.hits += 1
            return ids

    def put(self, piece: str, ids: tuple[int, ...]) -> None:
        size = self.entry_bytes(piece, ids)
        if size > self.max_bytes // 8:
            return
        with self._lock:
            old = self._entries.pop(piece, None)
            if old is not None:
                self.bytes -= self.entry_bytes(piece, old)
            self._entries[piece] = ids
            self.bytes += size
            while self.bytes > self.max_bytes:
                key, value = self._entries.popitem(last=False)
                self.bytes -= self.entry_bytes(key, value)
