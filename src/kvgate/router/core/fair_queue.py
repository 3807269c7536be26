"""The order in which queued requests leave: strict priority bands, and within a band start-time
fair queueing (SFQ, Goyal, Vin and Cheng, SIGCOMM 1996) between flows (tenants) over a cost
(prompt tokens).

- A band is a priority: items of a higher band always leave first.
- Each flow has the finish tag of its last item. An item arriving with cost `c` in a flow of
  weight `w` gets the start tag `S = max(V, F_flow)`, and the flow's finish tag becomes
  `S + c / w`. Items leave in order of start tag (ties: arrival order).
- The band's virtual time `V` is the start tag of the item that left it last, so a flow that
  was idle comes back at the current virtual time: it is neither punished for its burst nor
  credited for its silence.

A flow sending 100k-token prompts therefore advances its tags 100 times faster than one sending
1k-token prompts, and the short prompts of the other flow leave in between, whatever the
arrival order. Pure data structure: no clock, no I/O; the admission queue (`admission.py`) owns
one per pool and class.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Queued(Generic[T]):
    """One item in a fair queue, with its tags."""

    item: T
    flow: str
    band: int  # higher leaves first
    start: float
    seq: int

    @property
    def order(self) -> tuple[int, float, int]:
        return (-self.band, self.start, self.seq)


class FairQueue(Generic[T]):
    """Items in leaving order. `push`, `take` and `remove` are O(n) memmoves of a sorted list
    (n is bounded by the admission queue's length); iteration in order is free."""

    def __init__(self) -> None:
        self._order: list[tuple[int, float, int]] = []
        self._items: dict[int, Queued[T]] = {}
        self._finish: dict[tuple[int, str], float] = {}  # (band, flow) -> last finish tag
        self._virtual: dict[int, float] = {}  # band -> virtual time
        self._counts: dict[tuple[int, str], int] = {}  # (band, flow) -> items queued
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def push(self, item: T, flow: str, *, band: int, cost: float, weight: float) -> Queued[T]:
        key = (band, flow)
        start = max(self._virtual.get(band, 0.0), self._finish.get(key, 0.0))
        self._finish[key] = start + max(cost, 1.0) / weight
        self._counts[key] = self._counts.get(key, 0) + 1
        queued = Queued(item, flow, band, start, next(self._seq))
        bisect.insort(self._order, queued.order)
        self._items[queued.seq] = queued
        return queued

    def take(self, queued: Queued[T]) -> bool:
        """`queued` leaves because it is served: the band's virtual time moves to its start.
        False if it was not queued."""
        if not self._drop(queued):
            return False
        band = queued.band
        self._virtual[band] = max(self._virtual.get(band, 0.0), queued.start)
        self._forget_idle_flows(band)
        return True

    def restore(self, queued: Queued[T]) -> None:
        """Put back an item that left (served too early): same tags, same place."""
        if queued.seq in self._items:
            return
        key = (queued.band, queued.flow)
        self._counts[key] = self._counts.get(key, 0) + 1
        bisect.insort(self._order, queued.order)
        self._items[queued.seq] = queued

    def remove(self, queued: Queued[T]) -> bool:
        """`queued` leaves unserved (deadline, disconnect); False if it was not queued."""
        return self._drop(queued)

    def __iter__(self) -> Iterator[Queued[T]]:
        """Items in leaving order (do not push or remove while iterating)."""
        items = self._items
        for _band, _start, seq in self._order:
            yield items[seq]

    def count(self, band: int, flow: str) -> int:
        """Items of `flow` queued in `band`."""
        return self._counts.get((band, flow), 0)

    def newest_of_largest_flow(self) -> Queued[T] | None:
        """The last-leaving item of the flow with the most items in the lowest band (the one to
        push out when the queue is full); None when empty."""
        if not self._counts:
            return None
        band, flow = min(self._counts, key=lambda key: (key[0], -self._counts[key]))
        for _band, _start, seq in reversed(self._order):
            item = self._items[seq]
            if item.band == band and item.flow == flow:
                return item
        return None

    def position(self, queued: Queued[T]) -> int:
        """How many items leave before `queued`."""
        return bisect.bisect_left(self._order, queued.order)

    def _drop(self, queued: Queued[T]) -> bool:
        if self._items.pop(queued.seq, None) is None:
            return False
        order = queued.order
        i = bisect.bisect_left(self._order, order)
        del self._order[i]
        key = (queued.band, queued.flow)
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]
        return True

    def _forget_idle_flows(self, band: int) -> None:
        """A flow with nothing queued whose finish tag the virtual time has passed starts from
        the virtual time anyway: drop its tag (what is kept stays bounded by the busy flows)."""
        virtual = self._virtual[band]
        idle = [
            key
            for key, finish in self._finish.items()
            if key[0] == band and finish <= virtual and key not in self._counts
        ]
        for key in idle:
            del self._finish[key]
