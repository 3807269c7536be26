"""Where a pool's endpoints come from (a static list, or Kubernetes), and the endpoint set.

A `Discovery` keeps one pool's endpoints in the shared `EndpointSet` up to date between `start()`
and `stop()`; `stop()` leaves the endpoints in place (a reload may start a replacement).
"""

from __future__ import annotations

from typing import Protocol

from kvgate.api.router_config import PoolConfig
from kvgate.discovery.endpoints import EndpointSet


class Discovery(Protocol):
    pool: PoolConfig

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def build_discovery(pool: PoolConfig, endpoints: EndpointSet) -> Discovery:
    if pool.endpoints.static is not None:
        from kvgate.discovery.static import StaticDiscovery

        return StaticDiscovery(pool, endpoints)
    from kvgate.discovery.kubernetes import EndpointSliceDiscovery

    return EndpointSliceDiscovery(pool, endpoints)
