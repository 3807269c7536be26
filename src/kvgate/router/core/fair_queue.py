"""The order in which queued requests leave: strict priority bands, within a band start-time
fair queueing (SFQ, Goyal, Vin and Cheng, SIGCOMM 1996) between flows (tenants) over a cost
(prompt tokens), and within a flow by urgency.

- A band is a priority: items of a higher band always leave first.
- Each flow has the finish tag of its last item. An item arriving with cost `c` in a flow of
  weight `w` adds a slot with the start tag `S = max(V, F_flow)` to its flow, and the flow's
  finish tag becomes `S + c / w`. Slots leave in order of start tag (ties: creation order).
- A flow's items fill its slots in order of urgency (lower first; ties: arrival order), so
  within a flow an urgent item that arrives late takes an earlier slot and every less urgent
  one moves one slot later; the flows' shares stay SFQ's. With equal urgencies a flow is
  first come, first served.
- The band's virtual time `V` is the start tag of the slot that left it last, so a flow that
  was idle comes back at the current virtual time: it is neither punished for its burst nor
  credited for its silence.

A flow sending 100k-token prompts therefore advances its tags 100 times faster than one sending
1k-token prompts, and the short prompts of the other flow leave in between, whatever the
arrival order. Pure data structure: no clock, no I/O; the admission queue (`admission.py`) owns
one per pool and class and sets the urgencies.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


Slot = tuple[float, int]  # (start tag, creation number)
FlowKey = tuple[int, str]  # (band, flow)


@dataclass(slots=True, eq=False)
class Queued(Generic[T]):
    """One item in a fair queue."""

    item: T
    flow: str
    band: int  # higher leaves first
    urgency: float  # within its flow, lower leaves first
    seq: int
    slot: Slot | None = None  # the slot it gave up when it left (`restore` takes it back)

    @property
    def rank_key(self) -> tuple[float, int]:
        return (self.urgency, self.seq)


@dataclass(slots=True)
class _Flow:
    """The queued items of one flow in one band, and as many slots."""

    slots: list[Slot] = field(default_factory=list)  # by start tag
    items: list[tuple[float, int]] = field(default_factory=list)  # rank keys, by urgency


class FairQueue(Generic[T]):
    """Items in leaving order. `push`, `take` and `remove` are O(n) memmoves of sorted lists
    (n is bounded by the admission queue's length); iteration in order is O(1) per item."""

    def __init__(self) -> None:
        self._slots: list[tuple[int, float, int]] = []  # (-band, start, slot number), sorted
        self._slot_flow: dict[int, FlowKey] = {}
        self._flows: dict[FlowKey, _Flow] = {}  # flows with items queued
        self._items: dict[int, Queued[T]] = {}
        self._finish: dict[FlowKey, float] = {}  # last finish tag
        self._virtual: dict[int, float] = {}  # band -> virtual time
        self._seq = itertools.count()
        self._slot_seq = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def push(
        self, item: T, flow: str, *, band: int, cost: float, weight: float, urgency: float = 0.0
    ) -> Queued[T]:
        key = (band, flow)
        start = max(self._virtual.get(band, 0.0), self._finish.get(key, 0.0))
        self._finish[key] = start + max(cost, 1.0) / weight
        queued = Queued(item, flow, band, urgency, next(self._seq))
        self._insert(queued, (start, next(self._slot_seq)))
        return queued

    def take(self, queued: Queued[T]) -> bool:
        """`queued` leaves because it is served: the band's virtual time moves to the start of
        the slot it held. False if it was not queued."""
        if not self._drop(queued):
            return False
        band = queued.band
        assert queued.slot is not None
        self._virtual[band] = max(self._virtual.get(band, 0.0), queued.slot[0])
        self._forget_idle_flows(band)
        return True

    def restore(self, queued: Queued[T]) -> None:
        """Put back an item that left (served too early) with the slot it gave up."""
        if queued.seq in self._items or queued.slot is None:
            return
        self._insert(queued, queued.slot)

    def remove(self, queued: Queued[T]) -> bool:
        """`queued` leaves unserved (deadline, disconnect); False if it was not queued."""
        return self._drop(queued)

    def __iter__(self) -> Iterator[Queued[T]]:
        """Items in leaving order (do not push or remove while iterating)."""
        ranks: dict[FlowKey, int] = {}
        for _band, _start, slot in self._slots:
            key = self._slot_flow[slot]
            rank = ranks.get(key, 0)
            ranks[key] = rank + 1
            yield self._items[self._flows[key].items[rank][1]]

    def count(self, band: int, flow: str) -> int:
        """Items of `flow` queued in `band`."""
        queued = self._flows.get((band, flow))
        return len(queued.items) if queued is not None else 0

    def newest_of_largest_flow(self) -> Queued[T] | None:
        """The last-leaving item of the flow with the most items in the lowest band (the one to
        push out when the queue is full); None when empty."""
        if not self._flows:
            return None
        key = min(self._flows, key=lambda key: (key[0], -len(self._flows[key].items)))
        return self._items[self._flows[key].items[-1][1]]

    def position(self, queued: Queued[T]) -> int:
        """How many items leave before `queued`."""
        flow = self._flows[(queued.band, queued.flow)]
        start, slot = flow.slots[bisect.bisect_left(flow.items, queued.rank_key)]
        return bisect.bisect_left(self._slots, (-queued.band, start, slot))

    def _insert(self, queued: Queued[T], slot: Slot) -> None:
        key = (queued.band, queued.flow)
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = _Flow()
        bisect.insort(flow.slots, slot)
        bisect.insort(flow.items, queued.rank_key)
        bisect.insort(self._slots, (-queued.band, *slot))
        self._slot_flow[slot[1]] = key
        self._items[queued.seq] = queued
        queued.slot = None

    def _drop(self, queued: Queued[T]) -> bool:
        """Take `queued` and the slot of its rank out (the ranks after it keep their slots)."""
        if self._items.pop(queued.seq, None) is None:
            return False
        key = (queued.band, queued.flow)
        flow = self._flows[key]
        rank = bisect.bisect_left(flow.items, queued.rank_key)
        del flow.items[rank]
        start, slot = queued.slot = flow.slots.pop(rank)
        del self._slots[bisect.bisect_left(self._slots, (-queued.band, start, slot))]
        del self._slot_flow[slot]
        if not flow.items:
            del self._flows[key]
        return True

    def _forget_idle_flows(self, band: int) -> None:
        """A flow with nothing queued whose finish tag the virtual time has passed starts from
        the virtual time anyway: drop its tag (what is kept stays bounded by the busy flows)."""
        virtual = self._virtual[band]
        idle = [
            key
            for key, finish in self._finish.items()
            if key[0] == band and finish <= virtual and key not in self._flows
        ]
        for key in idle:
            del self._finish[key]
