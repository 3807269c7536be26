"""Endpoints listed in the config. The generation is fixed (`static`): a restarted engine behind a
static URL is noticed by its KV events' sequence reset, not by discovery. The KV-event topic is
the endpoint's `kv_topic`, else the operator's convention built from the URL's host."""

from __future__ import annotations

from urllib.parse import urlsplit

from kvgate.api.router_config import PoolConfig
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec, kv_topic


def static_specs(pool: PoolConfig) -> list[EndpointSpec]:
    assert pool.endpoints.static is not None
    return [
        EndpointSpec(
            id=ep.endpoint_id,
            pool=pool.key,
            url=ep.url,
            kv_events=ep.kv_events if pool.engine.kv_events else None,
            kv_replay=ep.kv_replay if pool.engine.kv_events else None,
            kv_topic=ep.kv_topic if ep.kv_topic is not None else _topic(ep.url, pool.model),
            generation="static",
        )
        for ep in pool.endpoints.static
    ]


def _topic(url: str, model: str) -> str:
    return kv_topic(urlsplit(url).hostname or "", model)


class StaticDiscovery:
    def __init__(self, pool: PoolConfig, endpoints: EndpointSet) -> None:
        self.pool = pool
        self._endpoints = endpoints

    async def start(self) -> None:
        await self._endpoints.replace_pool(self.pool.key, static_specs(self.pool))

    async def stop(self) -> None:
        return None
