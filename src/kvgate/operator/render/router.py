"""RoutingPolicy + its InferencePools -> router config, ConfigMap, Deployment, Service, RBAC.

`router_config` translates the policy (Kubernetes conventions) and each selected pool into the
router's own typed configuration, :class:`kvgate.api.router_config.RouterConfig`, which validates
it; the YAML goes into a ConfigMap that the router pods mount as a directory (never `subPath`),
so the kubelet swaps the file in place and the router reloads it without a restart. Secrets the
configuration needs (tenant API keys and salts, the Redis password, the admin token) are mounted
read-only and referenced by file, never copied into the ConfigMap. Each pool's engines are
discovered by the label selector of its Deployment, so the router only needs to watch Pods in
its namespace: that is the whole of its Role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kvgate.api import router_config as rc
from kvgate.api.base import JsonDict, SecretKeyRef
from kvgate.api.policy import RoutingPolicySpec, TenantSpec
from kvgate.api.pool import InferencePoolSpec
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
    probe,
    recommended_labels,
)
from kvgate.operator.render.engine import engine_selector_string

ROUTER_COMPONENT = "router"
CONFIG_DIR = "/etc/kvgate"
CONFIG_FILE = "router.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
SECRETS_DIR = "/var/run/kvgate/secrets"
TOKENIZERS_DIR = "/var/lib/kvgate/tokenizers"
CONFIG_HASH_ANNOTATION = "kvgate.io/config-hash"
ROUTER_PORT = 8000


@dataclass(frozen=True, slots=True)
class SelectedPool:
    """An InferencePool a policy routes to."""

    name: str
    namespace: str
    spec: InferencePoolSpec


def router_name(policy: str) -> str:
    return dns_label(policy, "router")


def config_map_name(policy: str) -> str:
    return dns_label(policy, "router-config", max_length=253)


def router_selector(policy: str) -> dict[str, str]:
    return {
        NAME_LABEL: "kvgate",
        COMPONENT_LABEL: ROUTER_COMPONENT,
        INSTANCE_LABEL: policy,
        POLICY_LABEL: policy,
    }


def router_labels(policy: str) -> dict[str, str]:
    return {**recommended_labels(ROUTER_COMPONENT, policy), POLICY_LABEL: policy}


def _secret(ref: SecretKeyRef) -> rc.SecretRef:
    return rc.SecretRef(file=f"{SECRETS_DIR}/{ref.name}/{ref.key}")


def _tokenizer(pool: SelectedPool) -> rc.TokenizerConfig:
    source = pool.spec.tokenizer
    if source is None:
        return rc.TokenizerConfig()
    path = source.path
    if source.config_map is not None:
        path = f"{TOKENIZERS_DIR}/{pool.name}"
    chat_template = None
    if source.chat_template is not None:
        chat_template = f"{path}/{source.chat_template}" if path else source.chat_template
    extra: dict[str, Any] = {}
    if source.approximate_chars_per_block is not None:
        extra["approximate_chars_per_block"] = source.approximate_chars_per_block
    return rc.TokenizerConfig(path=path, chat_template=chat_template, **extra)


def pool_config(pool: SelectedPool) -> rc.PoolConfig:
    spec = pool.spec
    return rc.PoolConfig(
        name=pool.name,
        namespace=pool.namespace,
        model=spec.served_name,
        pool_class=str(spec.pool_class),  # type: ignore[arg-type]
        engine=rc.EngineConfig(
            block_size=spec.engine.block_size,
            hash_algo=spec.cache.hash_algo,
            hash_seed=str(spec.cache.hash_seed),
            tokenizer=_tokenizer(pool),
            kv_events=True,
        ),
        endpoints=rc.EndpointsConfig(
            kubernetes=rc.KubernetesDiscovery(
                namespace=pool.namespace, label_selector=engine_selector_string(pool.name)
            )
        ),
    )


def _tenant(tenant: TenantSpec) -> rc.TenantConfig:
    return rc.TenantConfig(
        name=tenant.name,
        api_keys=[_secret(k) for k in tenant.api_keys],
        cache_salt=_secret(tenant.cache_salt) if tenant.cache_salt else None,
        request_class=tenant.request_class,  # type: ignore[arg-type]
    )


def router_config(spec: RoutingPolicySpec, pools: list[SelectedPool]) -> rc.RouterConfig:
    """The router configuration; raises ValueError (pydantic) if it would be invalid."""
    redis = spec.directory.redis
    tenants = spec.tenants
    return rc.RouterConfig(
        pools=[pool_config(p) for p in pools],
        classes=rc.ClassesConfig(
            default=str(spec.classes.default),  # type: ignore[arg-type]
            header=spec.classes.header or None,
            rules=[
                rc.ClassRule.model_validate(r.model_dump(mode="json")) for r in spec.classes.rules
            ],
        ),
        borrowing=rc.BorrowingConfig.model_validate(spec.borrowing.model_dump()),
        policy=rc.PolicyConfig(
            name=spec.scoring.name,
            params=dict(spec.scoring.params),
            max_affinity_wait_seconds=spec.scoring.max_affinity_wait_seconds,
            seed=spec.scoring.seed,
        ),
        sessions=rc.SessionsConfig(
            header=spec.sessions.header or None,
            use_openai_user=spec.sessions.use_openai_user,
            max_sessions=spec.sessions.max_sessions,
            ttl_seconds=spec.sessions.ttl_seconds,
        ),
        tenants=rc.TenantsConfig(
            tenants=[_tenant(t) for t in tenants.items],
            unknown_key=tenants.unknown_key,  # type: ignore[arg-type]
            anonymous_tenant=tenants.anonymous_tenant,
            salt_secret=_secret(tenants.salt_secret) if tenants.salt_secret else None,
            pass_client_salt=tenants.pass_client_salt,
        ),
        directory=rc.DirectoryConfig(
            backend=spec.directory.backend,  # type: ignore[arg-type]
            redis=rc.RedisConfig(
                url=redis.url,
                key_prefix=redis.key_prefix,
                password=_secret(redis.password) if redis.password else None,
                socket_timeout_seconds=redis.socket_timeout_seconds,
            ),
            embedded_indexer=spec.directory.embedded_indexer,
            approximate_ttl_seconds=spec.directory.approximate_ttl_seconds,
        ),
        admin=rc.AdminConfig(
            token=_secret(spec.router.admin_token) if spec.router.admin_token else None
        ),
    )


def router_config_yaml(config: rc.RouterConfig) -> str:
    """The YAML the router reads: only values that differ from the router's defaults."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False)


def secret_refs(spec: RoutingPolicySpec) -> list[SecretKeyRef]:
    refs = [k for t in spec.tenants.items for k in t.api_keys]
    refs += [t.cache_salt for t in spec.tenants.items if t.cache_salt]
    for ref in (spec.tenants.salt_secret, spec.directory.redis.password, spec.router.admin_token):
        if ref is not None:
            refs.append(ref)
    return refs


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
    for secret in sorted({ref.name for ref in secret_refs(spec)}):
        volume = dns_label("secret", secret)
        volumes.append({"name": volume, "secret": {"secretName": secret}})
        mounts.append({"name": volume, "mountPath": f"{SECRETS_DIR}/{secret}", "readOnly": True})
    for pool in pools:
        source = pool.spec.tokenizer
        if source is not None and source.config_map is not None:
            volume = dns_label("tokenizer", pool.name)
            volumes.append({"name": volume, "configMap": {"name": source.config_map}})
            mounts.append(
                {"name": volume, "mountPath": f"{TOKENIZERS_DIR}/{pool.name}", "readOnly": True}
            )
    return volumes, mounts


def router_deployment(
    owner: Owner, spec: RoutingPolicySpec, pools: list[SelectedPool], default_image: str
) -> JsonDict:
    router = spec.router
    volumes, mounts = _volumes(owner, spec, pools)
    container: JsonDict = {
        "name": "router",
        "image": router.image or default_image,
        "command": ["kvgate"],
        "args": ["--log-level", router.log_level, "router", "--config", CONFIG_PATH],
        "env": [
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": probe("/health", "http", period=5, failures=3),
        "livenessProbe": probe("/health", "http", period=10, failures=3),
        "resources": router.resources.to_wire(),
        "volumeMounts": mounts,
    }
    if router.image_pull_policy is not None:
        container["imagePullPolicy"] = str(router.image_pull_policy)
    pod = router.pod
    pod_spec: JsonDict = {
        "serviceAccountName": router_name(owner.name),
        "containers": [container],
        "volumes": volumes,
    }
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in pod.tolerations]
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    template_meta: JsonDict = {"labels": {**pod.labels, **router_labels(owner.name)}}
    if pod.annotations:
        template_meta["annotations"] = dict(pod.annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(router_name(owner.name), owner, router_labels(owner.name)),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": router_selector(owner.name)},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def router_service(owner: Owner, spec: RoutingPolicySpec) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(router_name(owner.name), owner, router_labels(owner.name)),
        "spec": {
            "type": spec.router.service_type,
            "selector": router_selector(owner.name),
            "ports": [
                {"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def router_rbac(owner: Owner) -> list[JsonDict]:
    """ServiceAccount, Role (read Pods: endpoint discovery) and RoleBinding of the router."""
    name = router_name(owner.name)
    labels = router_labels(owner.name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, owner, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(name, owner, labels),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
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
) -> tuple[list[JsonDict], str]:
    """Every object a RoutingPolicy owns, in apply order, and the rendered config's hash.

    Raises ValueError (pydantic.ValidationError) when the router config would be invalid.
    """
    config_yaml = router_config_yaml(router_config(spec, pools))
    children = [
        *router_rbac(owner),
        router_config_map(owner, config_yaml),
        router_service(owner, spec),
        router_deployment(owner, spec, pools, default_image),
    ]
    return children, content_hash(config_yaml)
