"""EndpointSlices → the pool's endpoints: readiness, terminating endpoints, dual stack, ports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvgate.api.router_config import RouterConfig
from kvgate.discovery.kubernetes import pool_endpoint_specs


def _pool(**kubernetes: Any) -> Any:
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "namespace": "ns",
                    "model": "m",
                    "endpoints": {"kubernetes": {"service": "p", **kubernetes}},
                }
            ]
        }
    )
    return config.pools[0]


def _endpoint(
    pod: str | None,
    ip: str,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
) -> SimpleNamespace:
    conditions = SimpleNamespace(ready=ready, serving=serving, terminating=terminating)
    ref = SimpleNamespace(kind="Pod", name=pod, namespace="ns", uid=f"uid-{pod}") if pod else None
    return SimpleNamespace(addresses=[ip], conditions=conditions, target_ref=ref)


def _slice(
    *endpoints: SimpleNamespace, family: str = "IPv4", ports: dict[str, int] | None = None
) -> SimpleNamespace:
    named = ports if ports is not None else {"http": 8000, "kv-events": 5557, "kv-replay": 5558}
    return SimpleNamespace(
        metadata=SimpleNamespace(name=f"p-{family}", namespace="ns"),
        address_type=family,
        ports=[SimpleNamespace(name=n, port=p) for n, p in named.items()],
        endpoints=list(endpoints),
    )


def _ids(pool: Any, *slices: SimpleNamespace) -> list[str]:
    return [s.id for s in pool_endpoint_specs(pool, pool.endpoints.kubernetes, slices)]


def test_ready_endpoints_are_routed_with_the_slice_ports_and_pod_identity() -> None:
    pool = _pool()
    slices = [_slice(_endpoint("e-0", "10.0.0.5"), ports={"http": 9000, "kv-events": 6000})]
    [spec] = pool_endpoint_specs(pool, pool.endpoints.kubernetes, slices)
    assert spec.id == "ns/e-0" and spec.generation == "uid-e-0" and spec.pool == "ns/p"
    assert spec.url == "http://10.0.0.5:9000"
    assert spec.kv_events == "tcp://10.0.0.5:6000" and spec.kv_replay == "tcp://10.0.0.5:5558"
    assert spec.kv_topic == "kv@10.0.0.5@m"


def test_unready_and_terminating_endpoints_leave_while_others_are_ready() -> None:
    pool = _pool()
    ready = _endpoint("a", "10.0.0.1")
    unready = _endpoint("b", "10.0.0.2", ready=False, serving=False)
    # A deleted pod still passing its probe: serving, terminating, ready=false (the API's rule).
    leaving = _endpoint("c", "10.0.0.3", ready=False, serving=True, terminating=True)
    # Conditions the controller left unset: ready counts as true.
    unset = SimpleNamespace(addresses=["10.0.0.4"], conditions=None, target_ref=None)
    assert _ids(pool, _slice(ready, unready, leaving, unset)) == ["ns/a", "ns/10.0.0.4"]


def test_serving_terminating_endpoints_are_used_only_when_none_is_ready() -> None:
    pool = _pool()
    leaving = _endpoint("c", "10.0.0.3", ready=False, serving=True, terminating=True)
    gone = _endpoint("d", "10.0.0.4", ready=False, serving=False, terminating=True)
    starting = _endpoint("e", "10.0.0.5", ready=False, serving=False)
    assert _ids(pool, _slice(leaving, gone, starting)) == ["ns/c"]
    assert _ids(pool, _slice(gone, starting)) == []


def test_dual_stack_uses_each_pod_once_in_the_preferred_family() -> None:
    v4 = _slice(_endpoint("a", "10.0.0.1"), _endpoint("b", "10.0.0.2"), family="IPv4")
    v6 = _slice(_endpoint("a", "fd00::1"), _endpoint("c", "fd00::3"), family="IPv6")
    fqdn = _slice(_endpoint("x", "engine.example"), family="FQDN")

    def urls(pool: Any) -> dict[str, str]:
        specs = pool_endpoint_specs(pool, pool.endpoints.kubernetes, [v4, v6, fqdn])
        return {s.id: s.url for s in specs}

    assert urls(_pool()) == {
        "ns/a": "http://10.0.0.1:8000",
        "ns/b": "http://10.0.0.2:8000",
        "ns/c": "http://[fd00::3]:8000",
    }
    preferred = pool_endpoint_specs(
        _pool(ip_family="IPv6"), _pool(ip_family="IPv6").endpoints.kubernetes, [v4, v6]
    )
    by_id = {s.id: s for s in preferred}
    assert by_id["ns/a"].url == "http://[fd00::1]:8000"
    assert by_id["ns/a"].kv_topic == "kv@fd00::1@m"
    assert by_id["ns/a"].kv_events == "tcp://[fd00::1]:5557"
    assert by_id["ns/b"].url == "http://10.0.0.2:8000"


def test_a_pool_without_kv_events_subscribes_to_nothing() -> None:
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"kv_events": False},
                    "endpoints": {"kubernetes": {"service": "p", "ports": {"http": "7000"}}},
                }
            ]
        }
    )
    pool = config.pools[0]
    [spec] = pool_endpoint_specs(
        pool, pool.endpoints.kubernetes, [_slice(_endpoint("a", "10.0.0.1"))]
    )
    assert spec.kv_events is None and spec.url == "http://10.0.0.1:7000"
