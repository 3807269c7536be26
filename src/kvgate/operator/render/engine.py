"""InferencePool -> the engine Deployment, Service and PodDisruptionBudget (pure functions).

The engine container runs `<command> <flags>`, where the flags are exactly those the router and
the simulator rely on (DESIGN.md §4): the model and its served name, `--port 8000`, the block
size, prefix caching with the pool's hash algorithm, KV events published on `tcp://*:5557` with
topic `kv@$(POD_IP)@<served model name>` and a replay socket on `tcp://*:5558`,
`--enable-prompt-tokens-details`, the memory and scheduling limits, then the user's extra args.
`PYTHONHASHSEED` seeds vLLM's hash chain; `$(POD_IP)` is expanded by the kubelet from the
`POD_IP` variable (downward API). Ports are named `http`, `kv-events` and `kv-replay` so that the
router discovers them by name.
"""

from __future__ import annotations

import json

from kvgate.api.base import JsonDict, Quantity
from kvgate.api.pool import InferencePoolSpec
from kvgate.operator.render.common import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAME_LABEL,
    POOL_CLASS_LABEL,
    POOL_LABEL,
    Owner,
    field_env,
    metadata,
    pod_scheduling,
    probe,
    recommended_labels,
    selector_string,
    service_port,
)

ENGINE_COMPONENT = "engine"
ENGINE_CONTAINER = "vllm"
HTTP_PORT = 8000
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
GPU_RESOURCE = "nvidia.com/gpu"
SERVED_MODEL_ANNOTATION = "kvgate.io/served-model-name"


def engine_selector(pool_name: str) -> dict[str, str]:
    """The (immutable) Deployment selector of a pool's engine pods."""
    return {
        NAME_LABEL: "kvgate",
        COMPONENT_LABEL: ENGINE_COMPONENT,
        INSTANCE_LABEL: pool_name,
        POOL_LABEL: pool_name,
    }


def engine_selector_string(pool_name: str) -> str:
    return selector_string(engine_selector(pool_name))


def engine_labels(pool_name: str, spec: InferencePoolSpec) -> dict[str, str]:
    return {
        **recommended_labels(ENGINE_COMPONENT, pool_name),
        POOL_LABEL: pool_name,
        POOL_CLASS_LABEL: str(spec.pool_class),
    }


def kv_events_config(served_model_name: str) -> str:
    """The `--kv-events-config` JSON (compact, keys in a fixed order)."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
        "replay_endpoint": f"tcp://*:{KV_REPLAY_PORT}",
        "topic": f"kv@$(POD_IP)@{served_model_name}",
    }
    return json.dumps(config, separators=(",", ":"))


def engine_args(spec: InferencePoolSpec) -> list[str]:
    """The `vllm serve` flags of a pool's engines."""
    engine = spec.engine
    args = [
        "--model",
        spec.model,
        "--served-model-name",
        spec.served_name,
        "--port",
        str(HTTP_PORT),
        "--block-size",
        str(engine.block_size),
        "--enable-prefix-caching",
        "--prefix-caching-hash-algo",
        str(spec.cache.hash_algo),
        "--kv-events-config",
        kv_events_config(spec.served_name),
        "--enable-prompt-tokens-details",
        "--gpu-memory-utilization",
        str(engine.gpu_memory_utilization),
    ]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if engine.max_num_seqs is not None:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.cpu_offload_gib is not None:
        args += ["--kv-offloading-backend", "native"]
        args += ["--kv-offloading-size", f"{engine.cpu_offload_gib:g}"]
    if spec.lora is not None:
        args += ["--enable-lora", "--max-loras", str(spec.lora.max_loras)]
        if spec.lora.max_lora_rank is not None:
            args += ["--max-lora-rank", str(spec.lora.max_lora_rank)]
        args += ["--lora-modules", *(f"{a.name}={a.path}" for a in spec.lora.adapters)]
    return args + list(engine.extra_args)


def engine_resources(spec: InferencePoolSpec) -> JsonDict:
    """Requests and limits, with `spec.gpus` as the nvidia.com/gpu limit unless set explicitly."""
    requests: dict[str, Quantity] = dict(spec.resources.requests)
    limits: dict[str, Quantity] = dict(spec.resources.limits)
    if spec.gpus > 0 and GPU_RESOURCE not in limits:
        limits[GPU_RESOURCE] = spec.gpus
        if GPU_RESOURCE in requests:
            requests[GPU_RESOURCE] = spec.gpus
    out: JsonDict = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def engine_container(spec: InferencePoolSpec) -> JsonDict:
    env: list[JsonDict] = [
        field_env("POD_IP", "status.podIP"),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "PYTHONHASHSEED", "value": str(spec.cache.hash_seed)},
    ]
    env += [{"name": e.name, "value": e.value} for e in spec.engine.env]
    container: JsonDict = {
        "name": ENGINE_CONTAINER,
        "image": spec.image,
        "command": list(spec.command),
        "args": engine_args(spec),
        "env": env,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
            {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": probe("/health", "http", period=5, failures=3),
        "livenessProbe": probe("/health", "http", period=10, failures=3, timeout=5),
        # Loading weights can take many minutes; liveness starts counting only after this.
        "startupProbe": probe("/health", "http", period=10, failures=180),
        "resources": engine_resources(spec),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if spec.image_pull_policy is not None:
        container["imagePullPolicy"] = str(spec.image_pull_policy)
    return container


def engine_pod_template(name: str, spec: InferencePoolSpec) -> JsonDict:
    pod = spec.pod
    labels = {**pod.labels, **engine_labels(name, spec)}
    annotations = {**pod.annotations, SERVED_MODEL_ANNOTATION: spec.served_name}
    pod_spec: JsonDict = {
        "containers": [engine_container(spec)],
        # vLLM's workers share tensors through /dev/shm; the container default of 64Mi is too small.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "terminationGracePeriodSeconds": 30,
        **pod_scheduling(pod),
    }
    if pod.service_account_name:
        pod_spec["serviceAccountName"] = pod.service_account_name
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}


def engine_deployment(owner: Owner, spec: InferencePoolSpec) -> JsonDict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner.name, owner, engine_labels(owner.name, spec)),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": engine_selector(owner.name)},
            "template": engine_pod_template(owner.name, spec),
        },
    }


def engine_service(owner: Owner, spec: InferencePoolSpec) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner.name, owner, engine_labels(owner.name, spec)),
        "spec": {
            "type": "ClusterIP",
            "selector": engine_selector(owner.name),
            "ports": [
                service_port("http", HTTP_PORT),
                service_port("kv-events", KV_EVENTS_PORT),
                service_port("kv-replay", KV_REPLAY_PORT),
            ],
        },
    }


def engine_pdb(owner: Owner, spec: InferencePoolSpec) -> JsonDict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner.name, owner, engine_labels(owner.name, spec)),
        "spec": {
            "maxUnavailable": spec.max_unavailable,
            "selector": {"matchLabels": engine_selector(owner.name)},
        },
    }


def pool_children(owner: Owner, spec: InferencePoolSpec) -> list[JsonDict]:
    """Every object an InferencePool owns, in the order they are applied."""
    return [
        engine_service(owner, spec),
        engine_pdb(owner, spec),
        engine_deployment(owner, spec),
    ]
