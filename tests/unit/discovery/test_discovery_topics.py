"""Each pod's KV-event subscription knows the exact topic the pod publishes: the operator's
`kv@$(POD_IP)@<model>` for Kubernetes pods, the same built from the URL for static endpoints
(or the endpoint's own `kv_topic`), and what the simulator fleet publishes."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import Any

from kvgate.api.router_config import RouterConfig
from kvgate.discovery.kubernetes import pool_endpoint_specs
from kvgate.discovery.static import static_specs
from kvgate.operator.render.engine import kv_events_config
from kvgate.sim.config import add_vllm_arguments
from kvgate.sim.fleet import add_fleet_arguments, fleet_configs


def _pool(endpoints: dict[str, Any], model: str = "llama") -> Any:
    config = RouterConfig.model_validate(
        {"pools": [{"name": "p", "model": model, "endpoints": endpoints}]}
    )
    return config.pools[0]


def test_static_endpoints_derive_the_operator_topic_or_take_their_own() -> None:
    pool = _pool(
        {
            "static": [
                {"url": "http://10.0.0.5:8000", "kv_events": "tcp://10.0.0.5:5557"},
                {"url": "http://[fd00::7]:8000", "kv_events": "tcp://[fd00::7]:5557"},
                {"url": "http://vllm-a:8000", "kv_events": "tcp://a:5557", "kv_topic": "mine"},
                {"url": "http://vllm-b:8000", "kv_events": "tcp://b:5557", "kv_topic": ""},
            ]
        }
    )
    topics = [spec.kv_topic for spec in static_specs(pool)]
    assert topics == ["kv@10.0.0.5@llama", "kv@fd00::7@llama", "mine", ""]


def _slice(ip: str) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name="s", namespace="ns"),
        address_type="IPv6" if ":" in ip else "IPv4",
        ports=[],
        endpoints=[
            SimpleNamespace(
                addresses=[ip],
                conditions=None,
                target_ref=SimpleNamespace(kind="Pod", name="e-0", namespace="ns", uid="u"),
            )
        ],
    )


def test_kubernetes_pods_expect_what_the_operator_renders() -> None:
    pool = _pool({"kubernetes": {"service": "llama"}}, model="Qwen/Qwen3-8B")
    rendered = json.loads(kv_events_config("Qwen/Qwen3-8B"))["topic"]
    for ip in ("10.244.1.7", "fd00::1:7"):
        [spec] = pool_endpoint_specs(pool, pool.endpoints.kubernetes, [_slice(ip)])
        assert spec.kv_topic == rendered.replace("$(POD_IP)", ip)


def test_the_simulator_fleet_publishes_the_topic_its_static_endpoints_expect() -> None:
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser, single_pod=False)
    add_fleet_arguments(parser)
    args = parser.parse_args(
        ["--model", "m", "--pods", "2", "--base-port", "9000", "--kv-events-base-port", "9100"]
    )
    configs = fleet_configs(args)
    pool = _pool(
        {
            "static": [
                {"url": f"http://{c.host}:{c.port}", "kv_events": c.kv_events.endpoint}
                for c in configs
            ]
        },
        model="m",
    )
    published = [c.kv_events.topic for c in configs]
    assert published == [spec.kv_topic for spec in static_specs(pool)]
