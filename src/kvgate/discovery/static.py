"""Endpoints listed in the config. The generation is fixed (`static`): a restarted engine behind a
static URL is noticed by its KV events' sequence reset, not by discovery."""

from __future__ import annotations

from kvgate.api.router_config import PoolConfig
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec


def static_specs(pool: PoolConfig) -> list[EndpointSpec]:
    assert pool.endpoints.static is not None
    return [
        EndpointSpec(
            id=ep.endpoint_id,
            pool=pool.key,
            url=ep.url,
            kv_events=ep.kv_events if pool.engine.kv_events else None,
            kv_replay=ep.kv_replay if pool.engine.kv_events else None,
            generation="static",
        )
        for ep in pool.endpoints.static
    ]


class StaticDiscovery:
    def __init__(self, pool: PoolConfig, endpoints: EndpointSet) -> None:
        self.pool = pool
        self._endpoints = endpoints

    async def start(self) -> None:
        await self._endpoints.replace_pool(self.pool.key, static_specs(self.pool))

    async def stop(self) -> None:
        return None
