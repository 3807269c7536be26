"""Load shared between router replicas: the peers' view, its age, and what Redis may hand back."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio.cluster import RedisCluster
from tests.unit.router.fakes import make_config, routing_core

from kvgate.api.fleet import LoadSharingConfig
from kvgate.api.router_config import RouterConfig
from kvgate.directory.replica_load import _parse
from kvgate.router.core.accounting import EndpointLoad
from kvgate.router.core.lifecycle import ClientRequest
from kvgate.router.core.peer_load import PeerLoads
from kvgate.router.http.load_sharing import LoadSharer
from kvgate.router.metrics import RouterMetrics


def test_the_other_replicas_loads_are_summed_and_added_to_ours():
    peers = PeerLoads(ttl_seconds=1.0)
    peers.update(
        {
            "b": {"x": EndpointLoad(1, 1, 100, 1)},
            "c": {"x": EndpointLoad(2, 0, 0), "y": EndpointLoad(1, 1, 5)},
        },
        now=10.0,
    )
    own = [EndpointLoad(1, 0, 0, 1), EndpointLoad(0, 0, 0), EndpointLoad(3, 1, 7)]
    assert peers.added(["x", "y", "z"], own, 10.5) == [
        EndpointLoad(4, 1, 100, 2),
        EndpointLoad(1, 1, 5),
        EndpointLoad(3, 1, 7),
    ]
    assert peers.replicas == 2


def test_a_stale_view_counts_nothing_and_a_fresh_one_counts_again():
    peers = PeerLoads(ttl_seconds=1.0)
    peers.update({"b": {"x": EndpointLoad(5, 5, 500)}}, now=10.0)
    own = [EndpointLoad(0, 0, 0)]
    assert peers.added(["x"], own, 11.5) == own  # Redis gone: own counts only
    peers.update({"b": {"x": EndpointLoad(1, 0, 0)}}, now=12.0)
    assert peers.added(["x"], own, 12.0) == [EndpointLoad(1, 0, 0)]
    peers.forget("x")
    assert peers.added(["x"], own, 12.0) == own


def test_what_redis_hands_back_is_checked():
    known = {f"p{i}": None for i in range(1, 9)}
    good = json.dumps({"p1": [1, 2, 300, 1], "p2": [0, 0, 0, 0]}).encode()
    assert _parse(good, known) == {"p1": (1, 2, 300, 1), "p2": (0, 0, 0, 0)}
    older = json.dumps({"p1": [1, 2, 300]}).encode()  # a replica that counts no batch apart
    assert _parse(older, known) == {"p1": (1, 2, 300, 0)}
    mixed = json.dumps({"p1": [1, 2], "p2": [-1, 0, 0], "p3": [1.5, 0, 0], "p4": [True, 0, 0],
                        "p5": [1 << 40, 0, 0], "p6": [1, 1, 1, 1], "p7": [1, 1, 1, 1, 1],
                        "p8": [1, 1, 1, -1], "p9": [1, 1, 1, 1]}).encode()  # fmt: skip
    assert _parse(mixed, known) == {"p6": (1, 1, 1, 1)}  # p9: a pod this replica does not know
    assert _parse(b"not json", known) is None
    assert _parse(b"[1, 2]", known) is None


async def test_a_decision_counts_what_the_other_replicas_have_queued():
    now = [100.0]
    core, endpoints = await routing_core(make_config(2), now, 2)
    body = {"model": "m", "prompt": list(range(256)), "max_tokens": 4}
    first = await core.explain(ClientRequest(body, {}, "completion"))
    busy = first.endpoint.id
    other = next(ep.id for ep in endpoints.all() if ep.id != busy)
    core.peers.update({"b": {busy: EndpointLoad(8, 8, 80_000)}}, now[0])
    plan = await core.explain(ClientRequest(body, {}, "completion"))
    assert plan.endpoint.id == other
    loads = {c["endpoint"]: c["load"] for c in plan.decision.to_dict()["candidates"]}
    assert loads[busy] == 8
    now[0] += 5.0  # the view aged out (no exchange since): back to our own counts
    assert (await core.explain(ClientRequest(body, {}, "completion"))).endpoint.id == busy


@pytest.mark.parametrize(
    ("enabled", "backend", "shares"),
    [
        (None, "redis", True),  # replicas on the shared directory share with no setting
        (None, "memory", False),  # one process: no one to share with
        (False, "redis", False),
        (True, "redis", True),
    ],
)
def test_load_sharing_is_on_by_default_exactly_with_the_redis_directory(
    enabled: bool | None, backend: str, shares: bool
) -> None:
    sharing = {} if enabled is None else {"enabled": enabled}
    config = make_config(2, load_sharing=sharing, directory={"backend": backend})
    assert config.load_sharing.enabled is enabled  # the file's value is kept as written
    assert config.load_sharing_enabled is shares


def test_load_sharing_forced_on_needs_the_redis_directory_and_a_ttl_over_its_interval():
    with pytest.raises(ValueError, match=r"needs directory\.backend: redis"):
        make_config(2, load_sharing={"enabled": True})
    config = make_config(2, load_sharing={"enabled": True}, directory={"backend": "redis"})
    assert isinstance(config, RouterConfig) and config.load_sharing_enabled
    with pytest.raises(ValueError, match="ttl_seconds"):
        LoadSharingConfig(interval_seconds=1.0, ttl_seconds=0.5)


async def test_a_router_on_the_memory_directory_never_reaches_for_redis():
    config = make_config(2)
    core, _ = await routing_core(config, [0.0], 2)
    metrics = RouterMetrics()
    metrics.load_sharing_degraded.set(1)  # left over from a config that shared
    sharer = LoadSharer(core, lambda: config, metrics, replica="a")
    sharer.start()
    try:
        await asyncio.sleep(0.05)  # the task looks at its config once, then idles
        assert sharer.redis.current is None
        assert metrics.registry.get_sample_value("kvgate_router_load_sharing_degraded") == 0
    finally:
        await sharer.stop()


async def test_load_sharing_reaches_redis_as_the_directory_does(monkeypatch):
    monkeypatch.setenv("URL", "redis://shared.example:6380/0")
    redis = {"url_secret": {"env": "URL"}, "cluster": True}
    config = make_config(
        2, load_sharing={"enabled": True}, directory={"backend": "redis", "redis": redis}
    )
    core, _ = await routing_core(config, [0.0], 2)
    sharer = LoadSharer(core, lambda: config, RouterMetrics(), replica="a")
    try:
        client = await sharer.redis.client(config.directory.redis)
        assert isinstance(client, RedisCluster)  # not a one-server client to `redis.url`
        assert [(n.host, n.port) for n in client.nodes_manager.startup_nodes.values()] == [
            ("shared.example", 6380)
        ]
        # one client until the config changes
        assert await sharer.redis.client(config.directory.redis) is client
    finally:
        await sharer.stop()
