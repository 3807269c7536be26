"""RoutingPolicy + its InferencePools -> the router's typed configuration (pure).

`router_config` translates the policy (Kubernetes conventions) and each selected pool into
:class:`kvgate.api.router_config.RouterConfig`, which validates the result: the router loads
exactly what the operator renders. Secrets are referenced by the file path where the router
pods mount them (never copied), a pool's tokenizer ConfigMap by its mount path, and each pool's
engines by the label selector of its Deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kvgate.api import router_config as rc
from kvgate.api.base import SecretKeyRef
from kvgate.api.policy import RoutingPolicySpec, TenantSpec
from kvgate.api.pool import InferencePoolSpec
from kvgate.operator.render.engine import engine_selector_string

SECRETS_DIR = "/var/run/kvgate/secrets"
TOKENIZERS_DIR = "/var/lib/kvgate/tokenizers"


@dataclass(frozen=True, slots=True)
class SelectedPool:
    """An InferencePool a policy routes to."""

    name: str
    namespace: str
    spec: InferencePoolSpec


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
