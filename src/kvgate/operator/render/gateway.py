"""Gateway API Inference Extension InferencePools as kvgate pools (pure).

An `inference.networking.k8s.io/v1` InferencePool declares which pods serve a model and on
which port: `spec.selector.matchLabels` (kept Service-compatible on purpose by that API),
`spec.targetPorts[].number`, and `spec.endpointPickerRef`, the gateway's endpoint picker, which
kvgate neither needs nor touches. For each `poolRefs` entry of a RoutingPolicy the operator renders
a headless Service (owned by the policy) with the pool's selector and its first target port as
port `http` (plus `kv-events` 5557 and `kv-replay` 5558 when the reference says the engines
publish KV events): Kubernetes then keeps EndpointSlices of exactly the pool's pods, which the
router watches as it does for kvgate's own pools. What the upstream pool does not say (model name,
block size, hashing, tokenizer) comes from the reference, and is scored the same way.

Further target ports (one endpoint per port, e.g. data-parallel ranks) are not routed to.
"""

from __future__ import annotations

from typing import Any

from kvgate.api.base import JsonDict
from kvgate.api.policy import GATEWAY_INFERENCE_GROUP, GATEWAY_INFERENCE_VERSION, GatewayPoolRef
from kvgate.api.pool import EngineSettings, InferencePoolSpec, LoraSettings
from kvgate.operator.render.common import Owner, dns_label, metadata, recommended_labels
from kvgate.operator.render.config import GatewayTarget, SelectedPool
from kvgate.operator.render.engine import KV_EVENTS_PORT, KV_REPLAY_PORT

GATEWAY_POOL_API_VERSION = f"{GATEWAY_INFERENCE_GROUP}/{GATEWAY_INFERENCE_VERSION}"
GATEWAY_POOL_KIND = "InferencePool"
GATEWAY_POOL_LABEL = "kvgate.io/gateway-pool"
GATEWAY_COMPONENT = "gateway-pool"


def gateway_service_name(policy: str, pool: str) -> str:
    return dns_label(policy, pool, "engines")


def _selector(spec: dict[str, Any]) -> dict[str, str]:
    labels = (spec.get("selector") or {}).get("matchLabels")
    if not isinstance(labels, dict) or not labels:
        raise ValueError("spec.selector.matchLabels is empty")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError("spec.selector.matchLabels must map strings to strings")
    return dict(labels)


def _target_port(spec: dict[str, Any]) -> int:
    ports = spec.get("targetPorts")
    if not isinstance(ports, list) or not ports or not isinstance(ports[0], dict):
        raise ValueError("spec.targetPorts is empty")
    number = ports[0].get("number")
    if not isinstance(number, int) or not 1 <= number <= 65535:
        raise ValueError(f"spec.targetPorts[0].number {number!r} is not a port number")
    return number


def gateway_pool(policy: str, namespace: str, ref: GatewayPoolRef, body: JsonDict) -> SelectedPool:
    """The pool a policy routes to for `ref`, given the upstream object `body`.

    Raises ValueError when the upstream pool has no usable selector or target port."""
    spec = body.get("spec") or {}
    target = GatewayTarget(
        service=gateway_service_name(policy, ref.name),
        selector=_selector(spec),
        port=_target_port(spec),
        kv_events=ref.kv_events,
        api_key=ref.api_key,
    )
    engines = InferencePoolSpec(
        model=ref.model,
        pool_class=ref.pool_class,
        engine=EngineSettings(block_size=ref.block_size, max_model_len=ref.max_model_len),
        cache=ref.cache,
        tokenizer=ref.tokenizer,
        lora=LoraSettings(adapters=ref.lora_adapters) if ref.lora_adapters else None,
    )
    return SelectedPool(name=ref.name, namespace=namespace, spec=engines, gateway=target)


def gateway_service(owner: Owner, pool: SelectedPool) -> JsonDict:
    """The headless Service whose EndpointSlices list a Gateway API pool's pods."""
    assert pool.gateway is not None
    target = pool.gateway
    # By number: the upstream API names no container ports.
    numbers = {"http": target.port}
    if target.kv_events:
        numbers |= {"kv-events": KV_EVENTS_PORT, "kv-replay": KV_REPLAY_PORT}
    ports = [
        {"name": name, "port": number, "targetPort": number, "protocol": "TCP"}
        for name, number in numbers.items()
    ]
    labels = {**recommended_labels(GATEWAY_COMPONENT, owner.name), GATEWAY_POOL_LABEL: pool.name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(target.service, owner, labels),
        "spec": {
            "clusterIP": "None",
            "selector": dict(target.selector),
            "ports": ports,
        },
    }
