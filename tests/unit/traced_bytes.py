"""What a block of code left allocated, for the tests that check a cache costs no more than it
counts: only allocations made in kvgate's code and in the calling test's file count, so that
another thread of the test process (a server an earlier test left serving, a worker pool)
allocating meanwhile does not (two such tests failed once in a full run, never alone)."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import kvgate

KVGATE = str(Path(kvgate.__file__).resolve().parent)


class Traced:
    bytes = 0


@contextlib.contextmanager
def traced_bytes(test_file: str) -> Iterator[Traced]:
    """`with traced_bytes(__file__) as traced:` ... `traced.bytes` once the block ended."""
    traced = Traced()
    ours = (KVGATE, str(Path(test_file).resolve()))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        yield traced
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    traced.bytes = sum(
        stat.size_diff
        for stat in after.compare_to(before, "filename")
        if stat.traceback[0].filename.startswith(ours)
    )
