"""What the other router replicas have in flight and pending prefill on each pod.

Several replicas behind one Service each count only their own requests (`accounting.py`); under
a burst they would all see the same pod idle and send it everything. The load exchange (the
live router's `http/load_sharing.py` over Redis, or the discrete-event bench in process) hands
this object the others' counts every interval; a decision adds them to this replica's own
(`routing.Router.snapshots`). A view older than `ttl_seconds` counts nothing (Redis down, or
the exchange stalled: the replica routes on its own counts until a fresh view arrives).

Plain synchronous code on the core's clock; the request path never waits on the exchange.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvgate.router.core.accounting import EndpointLoad

#: per replica id: per endpoint id, that replica's load on it
ReplicaLoads = Mapping[str, Mapping[str, EndpointLoad]]


class PeerLoads:
    """The sum over the other replicas of their load on each endpoint, with its age."""

    def __init__(self, ttl_seconds: float = 1.0) -> None:
        self.ttl_seconds = ttl_seconds
        self._sum: dict[str, EndpointLoad] = {}
        self._received_at = float("-inf")
        self.replicas = 0

    def update(self, replicas: ReplicaLoads, now: float) -> None:
        """A fresh view of every other replica (replaces the previous one)."""
        total: dict[str, list[int]] = {}
        for loads in replicas.values():
            for endpoint_id, load in loads.items():
                acc = total.setdefault(endpoint_id, [0, 0, 0, 0])
                acc[0] += load.in_flight
                acc[1] += load.pending_prefill_requests
                acc[2] += load.pending_prefill_tokens
                acc[3] += load.batch_in_flight
        self._sum = {ep: EndpointLoad(*counts) for ep, counts in total.items()}
        self._received_at = now
        self.replicas = len(replicas)

    def fresh(self, now: float) -> bool:
        return now - self._received_at <= self.ttl_seconds

    def added(
        self, endpoint_ids: Iterable[str], own: list[EndpointLoad], now: float
    ) -> list[EndpointLoad]:
        """`own` (this replica's loads of `endpoint_ids`, in order) plus the others'."""
        peers = self._sum
        if not peers or not self.fresh(now):
            return own
        out = []
        for endpoint_id, mine in zip(endpoint_ids, own, strict=True):
            theirs = peers.get(endpoint_id)
            out.append(
                mine
                if theirs is None
                else EndpointLoad(
                    mine.in_flight + theirs.in_flight,
                    mine.pending_prefill_requests + theirs.pending_prefill_requests,
                    mine.pending_prefill_tokens + theirs.pending_prefill_tokens,
                    mine.batch_in_flight + theirs.batch_in_flight,
                )
            )
        return out

    def forget(self, endpoint_id: str) -> None:
        self._sum.pop(endpoint_id, None)
