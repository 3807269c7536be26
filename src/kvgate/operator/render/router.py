"""RoutingPolicy + its InferencePools -> router ConfigMap, Deployment, Service, RBAC (pure).

The router configuration (:mod:`kvgate.operator.render.config`) goes into a ConfigMap that the router pods mount as a directory (never `subPath`),
so the kubelet swaps the file in place and the router reloads it without a restart. Secrets the
configuration needs (tenant API keys and salts, the Redis password, the admin token) reach the
container as `secretKeyRef` environment variables that the config names, never copied into
the ConfigMap. Each pool's engines are
discovered from the EndpointSlices of the pool's Service (for a Gateway API InferencePool, the
headless Service rendered by :mod:`kvgate.operator.render.gateway`), so the router only needs to
watch EndpointSlices in its namespace: that is the whole of its Role. With the Redis directory and
`embeddedIndexer: false`, a `kvgate indexer` Deployment (same config, same Role) feeds the
directory from the engines' KV events instead of the routers.
"""

from __future__ import annotations

import json
import math

from kvgate.api.base import JsonDict
from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.router_config import ServerConfig
from kvgate.operator.render.common import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAME_LABEL,
    POLICY_LABEL,
    Owner,
    content_hash,
    dns_label,
    field_env,
    metadata,
    pod_scheduling,
    probe,
    recommended_labels,
    service_port,
)
from kvgate.operator.render.config import (
    TOKENIZERS_DIR,
    SelectedPool,
    router_config,
    router_config_yaml,
    secret_env,
)
from kvgate.operator.render.gateway import gateway_service

_SHUTDOWN_GRACE_SECONDS: float = ServerConfig.model_fields["shutdown_grace_seconds"].default

ROUTER_COMPONENT = "router"
INDEXER_COMPONENT = "indexer"
INDEXER_PORT = 8001
CONFIG_DIR = "/etc/kvgate"
CONFIG_FILE = "router.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
CONFIG_HASH_ANNOTATION = "kvgate.io/config-hash"
ENGINES_HASH_ANNOTATION = "kvgate.io/engines-hash"  # on the indexer's pods
ROUTER_PORT = 8000
# The router drains for `server.shutdown_grace_seconds` after SIGTERM, then ends what is still
# open; the kubelet must not SIGKILL it before that is done (plus time to exit).
ROUTER_TERMINATION_GRACE_SECONDS = math.ceil(_SHUTDOWN_GRACE_SECONDS) + 15


def router_name(policy: str) -> str:
    return dns_label(policy, "router")


def config_map_name(policy: str) -> str:
    return dns_label(policy, "router-config", max_length=253)


def component_selector(policy: str, component: str) -> dict[str, str]:
    return {
        NAME_LABEL: "kvgate",
        COMPONENT_LABEL: component,
        INSTANCE_LABEL: policy,
        POLICY_LABEL: policy,
    }


def router_selector(policy: str) -> dict[str, str]:
    return component_selector(policy, ROUTER_COMPONENT)


def router_labels(policy: str) -> dict[str, str]:
    return {**recommended_labels(ROUTER_COMPONENT, policy), POLICY_LABEL: policy}


def router_config_map(owner: Owner, config_yaml: str) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            config_map_name(owner.name),
            owner,
            router_labels(owner.name),
            {CONFIG_HASH_ANNOTATION: content_hash(config_yaml)},
        ),
        "data": {CONFIG_FILE: config_yaml},
    }


def _volumes(
    owner: Owner, spec: RoutingPolicySpec, pools: list[SelectedPool]
) -> tuple[list[JsonDict], list[JsonDict]]:
    volumes: list[JsonDict] = [
        {"name": "config", "configMap": {"name": config_map_name(owner.name)}}
    ]
    mounts: list[JsonDict] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    for pool in pools:
        source = pool.spec.tokenizer
        if source is not None and source.config_map is not None:
            volume = dns_label("tokenizer", pool.name)
            volumes.append({"name": volume, "configMap": {"name": source.config_map}})
            mounts.append(
                {"name": volume, "mountPath": f"{TOKENIZERS_DIR}/{pool.name}", "readOnly": True}
            )
    return volumes, mounts


def _pod_security() -> JsonDict:
    """Pod Security "restricted", as the chart runs the operator and the indexer: the router
    and the indexer write no file (no temp files; tokenizers are read from their mounts)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> JsonDict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _kvgate_deployment(
    owner: Owner,
    spec: RoutingPolicySpec,
    pools: list[SelectedPool],
    default_image: str,
    *,
    component: str,
    command: list[str],
    port: tuple[str, int],
    replicas: int,
    resources: JsonDict,
    termination_grace_seconds: int | None = None,
    annotations: dict[str, str] | None = None,
) -> JsonDict:
    """A Deployment of `kvgate <command>` reading the policy's config (router or indexer);
    `annotations` go on its pods, with the policy's `router.pod.annotations`."""
    annotations = annotations or {}
    router = spec.router
    volumes, mounts = _volumes(owner, spec, pools)
    port_name, port_number = port
    container: JsonDict = {
        "name": component,
        "image": router.image or default_image,
        "command": ["kvgate"],
        "args": ["--log-level", router.log_level, *command, "--config", CONFIG_PATH],
        "env": [
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            *secret_env(spec),
        ],
        "ports": [{"name": port_name, "containerPort": port_number, "protocol": "TCP"}],
        "readinessProbe": probe("/health", port_name, period=5, failures=3),
        "livenessProbe": probe("/health", port_name, period=10, failures=3),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": _container_security(),
    }
    if router.image_pull_policy is not None:
        container["imagePullPolicy"] = str(router.image_pull_policy)
    pod = router.pod
    pod_spec: JsonDict = {
        "serviceAccountName": router_name(owner.name),
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
        **pod_scheduling(pod),
    }
    if termination_grace_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = termination_grace_seconds
    labels = {**recommended_labels(component, owner.name), POLICY_LABEL: owner.name}
    template_meta: JsonDict = {"labels": {**pod.labels, **labels}}
    if pod.annotations or annotations:
        template_meta["annotations"] = {**pod.annotations, **annotations}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(dns_label(owner.name, component), owner, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": component_selector(owner.name, component)},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def router_deployment(
    owner: Owner, spec: RoutingPolicySpec, pools: list[SelectedPool], default_image: str
) -> JsonDict:
    return _kvgate_deployment(
        owner,
        spec,
        pools,
        default_image,
        component=ROUTER_COMPONENT,
        command=["router"],
        port=("http", ROUTER_PORT),
        replicas=spec.router.replicas,
        resources={k: v for k, v in spec.router.resources.to_wire().items() if v},
        termination_grace_seconds=ROUTER_TERMINATION_GRACE_SECONDS,
    )


def indexer_name(policy: str) -> str:
    return dns_label(policy, INDEXER_COMPONENT)


def indexer_deployment(
    owner: Owner,
    spec: RoutingPolicySpec,
    pools: list[SelectedPool],
    default_image: str,
    replicas: int,
) -> JsonDict:
    """`kvgate indexer`: feeds the Redis directory from KV events when routers do not. It reads
    the config at start, so its pods carry a hash of the pools' engine settings (block size,
    hashing, CPU tier): a change of those rolls it (another edit of the policy would only drop
    the directory's entries, which new events alone restore)."""
    engines = [p.engine.model_dump(mode="json") for p in router_config(spec, pools).pools]
    return _kvgate_deployment(
        owner,
        spec,
        pools,
        default_image,
        component=INDEXER_COMPONENT,
        command=["indexer", "--port", str(INDEXER_PORT)],
        port=("http", INDEXER_PORT),
        replicas=replicas,
        resources={},
        annotations={ENGINES_HASH_ANNOTATION: content_hash(json.dumps(engines, sort_keys=True))},
    )


def indexer_service(owner: Owner) -> JsonDict:
    """The indexer's /metrics as a Service (port `http`, as the chart's ServiceMonitor scrapes
    routers and indexers): without it nothing scraped the KV-event metrics of such a policy."""
    labels = {**recommended_labels(INDEXER_COMPONENT, owner.name), POLICY_LABEL: owner.name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(indexer_name(owner.name), owner, labels),
        "spec": {
            "selector": component_selector(owner.name, INDEXER_COMPONENT),
            "ports": [service_port("http", INDEXER_PORT)],
        },
    }


def needs_indexer(spec: RoutingPolicySpec) -> bool:
    return spec.directory.backend == "redis" and not spec.directory.embedded_indexer


def router_service(owner: Owner, spec: RoutingPolicySpec) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(router_name(owner.name), owner, router_labels(owner.name)),
        "spec": {
            "type": spec.router.service_type,
            "selector": router_selector(owner.name),
            "ports": [service_port("http", ROUTER_PORT)],
        },
    }


def router_rbac(owner: Owner) -> list[JsonDict]:
    """ServiceAccount, Role (read EndpointSlices: endpoint discovery) and RoleBinding."""
    name = router_name(owner.name)
    labels = router_labels(owner.name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, owner, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(name, owner, labels),
            "rules": [
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(name, owner, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]


def policy_children(
    owner: Owner,
    spec: RoutingPolicySpec,
    pools: list[SelectedPool],
    default_image: str,
    indexer_replicas: int | None = None,
) -> tuple[list[JsonDict], str]:
    """Every object a RoutingPolicy owns, in apply order, and the rendered config's hash.

    The indexer Deployment is rendered with `indexer_replicas` replicas; None leaves it out
    (the caller passes 1 when `needs_indexer`, 0 to park one that is no longer needed).
    Raises ValueError (pydantic.ValidationError) when the router config would be invalid.
    """
    config_yaml = router_config_yaml(router_config(spec, pools))
    children = [
        *router_rbac(owner),
        *(gateway_service(owner, p) for p in pools if p.gateway is not None),
        router_config_map(owner, config_yaml),
        router_service(owner, spec),
        router_deployment(owner, spec, pools, default_image),
    ]
    if indexer_replicas is not None:
        children.append(indexer_deployment(owner, spec, pools, default_image, indexer_replicas))
        children.append(indexer_service(owner))
    return children, content_hash(config_yaml)
