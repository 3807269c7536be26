"""Service → backend and hosts-file mapping of the pod runner's service proxy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kvgate.podrunner.services import HOSTS_HEADER, Listener, hosts_file, ready_backends


def endpoint_slice(
    ports: list[dict[str, Any]], endpoints: list[tuple[str, bool | None]]
) -> dict[str, Any]:
    return {
        "ports": ports,
        "endpoints": [
            {"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
            for ip, ready in endpoints
        ],
    }


def test_only_ready_endpoints_on_the_named_port() -> None:
    slices = [
        endpoint_slice(
            [{"name": "http", "port": 8000}, {"name": "kv", "port": 5557}],
            [("10.244.0.3", True), ("10.244.1.4", False), ("10.244.0.9", None)],
        ),
        endpoint_slice([{"name": "http", "port": 8000}], [("10.244.1.2", True)]),
    ]
    assert ready_backends(slices, "http") == [
        ("10.244.0.3", 8000),
        ("10.244.0.9", 8000),
        ("10.244.1.2", 8000),
    ]
    assert ready_backends(slices, "kv") == [("10.244.0.3", 5557), ("10.244.0.9", 5557)]
    assert ready_backends(slices, "metrics") == []


def service(namespace: str, name: str, ip: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"clusterIP": ip}}


def test_hosts_file_names_short_only_when_unambiguous() -> None:
    text = hosts_file(
        [
            service("a", "redis", "10.96.0.10"),
            service("b", "redis", "10.96.0.11"),
            service("a", "router", "10.96.0.12"),
            service("a", "engines", "None"),
            service("a", "gone", "None"),
        ],
        headless_ips={"a/engines": "10.244.0.5"},
    )
    assert text.startswith(HOSTS_HEADER)
    lines = text[len(HOSTS_HEADER) :].splitlines()
    assert lines == [
        "10.244.0.5 engines.a.svc.cluster.local engines.a.svc engines.a engines",
        "10.96.0.10 redis.a.svc.cluster.local redis.a.svc redis.a",
        "10.96.0.12 router.a.svc.cluster.local router.a.svc router.a router",
        "10.96.0.11 redis.b.svc.cluster.local redis.b.svc redis.b",
    ]


async def test_a_connection_waits_for_an_endpoint_that_is_about_to_be_ready() -> None:
    listener = Listener("default/router", "http")
    asyncio.get_running_loop().call_later(0.2, listener.set_backends, [("10.244.0.5", 8000)])
    assert await listener.wait_and_pick() == ("10.244.0.5", 8000)


async def test_a_connection_with_no_endpoint_gives_up_after_its_wait() -> None:
    started = time.monotonic()
    listener = Listener("default/router", "http", endpoint_wait_seconds=0.3)
    assert await listener.wait_and_pick() is None
    assert 0.3 <= time.monotonic() - started < 2
