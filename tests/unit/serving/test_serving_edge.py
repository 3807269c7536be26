"""The connection budget under the open-files limit, and which connection the cap evicts."""

from __future__ import annotations

import resource

from kvgate.serving import MAX_PENDING_REFUSALS, connection_budget
from kvgate.serving.edge import EdgeLimits, EdgeState


def test_connection_budget_stays_under_the_open_files_limit(monkeypatch):
    def limit(soft: int):
        monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, soft))

    limit(256)
    assert connection_budget(2048, 64) == (256 - 64 - MAX_PENDING_REFUSALS) // 2 == 80
    limit(1 << 20)
    assert connection_budget(2048, 64) == 2048  # the configured cap when files are plenty
    limit(64)
    assert connection_budget(2048, 64) == 1  # never zero: the router must still answer
    monkeypatch.setattr(resource, "getrlimit", lambda _w: (resource.RLIM_INFINITY,) * 2)
    assert connection_budget(300, 64) == 300


class _Conn:
    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self.evicted = False

    def is_idle(self) -> bool:
        return self.idle

    def evict(self) -> None:
        self.evicted = True


def test_at_the_cap_the_oldest_idle_connection_makes_room():
    closed: list[str] = []
    state = EdgeState(EdgeLimits(max_connections=3), on_close=closed.append)
    busy, old_idle, new_idle = _Conn(False), _Conn(True), _Conn(True)
    for conn in (busy, old_idle, new_idle):
        assert state.admit(conn)
    newcomer = _Conn(False)
    old_idle_evict = old_idle.evict

    def evict() -> None:  # what EdgeProtocol.evict does to the shared state
        old_idle_evict()
        state.admitted.pop(old_idle)

    old_idle.evict = evict
    assert state.admit(newcomer)
    assert old_idle.evicted and not new_idle.evicted and not busy.evicted
    assert list(state.admitted) == [busy, new_idle, newcomer]
    new_idle.idle = False
    assert not state.admit(_Conn(False))  # all busy: refused
    assert state.open_connections == 3
