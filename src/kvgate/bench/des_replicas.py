"""Router replicas in the discrete-event bench: ``count`` routing cores, each with its own
endpoint set, accounting, metrics and seed, over one directory (as replicas share Redis). Each
request goes to one of them at random, as a Service spreads connections; every scrape reaches
all of them; given a load-sharing setting they exchange their loads as ``http/load_sharing.py``
does through Redis, in process and with no delay."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from kvgate.api.fleet import LoadSharingConfig
from kvgate.api.router_config import RouterConfig
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.discovery.endpoints import Endpoint, EndpointSet, EndpointSpec
from kvgate.discovery.endpoints import LoadSample as ScrapedLoad
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.metrics import RouterMetrics
from kvgate.router.runtime import build_state


@dataclass
class DesReplica:
    core: RoutingCore
    endpoints: EndpointSet
    in_order: list[Endpoint] = field(default_factory=list)  # the fleet's pods, in fleet order


class DesReplicas:
    """The replicas of one router config; replica k routes with seed ``seed + k``."""

    def __init__(
        self,
        config: RouterConfig,
        count: int,
        index: MemoryBlockIndex,
        clock: Callable[[], float],
        *,
        seed: int,
        load_sharing: LoadSharingConfig | None,
    ) -> None:
        if count < 1:
            raise ValueError("one or more replicas")
        self._clock = clock
        self.members = [self._replica(config, index, seed + k) for k in range(count)]
        # The bench's directory is in memory, so the exchange's settings come apart from the
        # router config (whose `load_sharing` needs a Redis directory); the one directory
        # stands for the shared Redis, so `enabled` unset means on, as it does live.
        shares = load_sharing is not None and load_sharing.active(shared_directory=True)
        self.sharing = load_sharing if count > 1 and shares else None
        if self.sharing is not None:
            for replica in self.members:
                replica.core.peers.ttl_seconds = self.sharing.ttl_seconds
        self._rng = random.Random(seed)

    def __iter__(self) -> Iterator[DesReplica]:
        return iter(self.members)

    @property
    def cores(self) -> list[RoutingCore]:
        return [replica.core for replica in self.members]

    def _replica(self, config: RouterConfig, index: MemoryBlockIndex, seed: int) -> DesReplica:
        config = config.model_copy(
            update={"policy": config.policy.model_copy(update={"seed": seed})}
        )
        endpoints = EndpointSet(self._clock)
        registry = CollectorRegistry()
        core = RoutingCore(
            build_state(config),
            endpoints,
            {config.pools[0].key: index},
            RouterMetrics(registry),
            DirectoryMetrics(registry).fallback_errors,
            clock=self._clock,
        )
        return DesReplica(core, endpoints)

    def pick(self) -> RoutingCore:
        """The replica a new request's connection reaches."""
        if len(self.members) == 1:
            return self.members[0].core
        return self._rng.choice(self.members).core

    async def join(self, pool_key: str, specs: list[EndpointSpec], joined: list[str]) -> None:
        """The pool's endpoints are now `specs`; those with ids `joined` are new."""
        for replica in self.members:
            await replica.endpoints.replace_pool(pool_key, specs)
            by_id = {ep.id: ep for ep in replica.endpoints.in_pool(pool_key)}
            replica.in_order = [by_id[spec.id] for spec in specs]
            replica.core.endpoints_changed([by_id[pod_id] for pod_id in joined], [])

    def scraped(self, pod: int, load: ScrapedLoad) -> None:
        """Every replica scrapes every pod (`pod`: its index in the fleet)."""
        for replica in self.members:
            replica.core.load_scraped(replica.in_order[pod], load)

    def exchange_loads(self, ids: list[str], now: float) -> None:
        """Every replica publishes its own loads of pods `ids`, then reads everyone else's."""
        published = {
            k: dict(zip(ids, replica.core.accounting.loads(ids, now), strict=True))
            for k, replica in enumerate(self.members)
        }
        for k, replica in enumerate(self.members):
            others = {str(j): loads for j, loads in published.items() if j != k}
            replica.core.peers.update(others, now)
