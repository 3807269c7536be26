"""RoutingPolicy + its InferencePools -> the router's typed configuration (pure).

`router_config` translates the policy (Kubernetes conventions) and each selected pool into
:class:`kvgate.api.router_config.RouterConfig`, which validates the result: the router loads
exactly what the operator renders. Secrets are never copied: the config names an environment
variable that the router container fills from the Secret key (`secretKeyRef`). A pool's
tokenizer ConfigMap is referenced by its mount path, and each pool's engines by the label
selector of its Deployment.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from kvgate.api import router_config as rc
from kvgate.api.base import JsonDict, SecretKeyRef
from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec
from kvgate.operator.render.engine import engine_selector_string

TOKENIZERS_DIR = "/var/lib/kvgate/tokenizers"


@dataclass(frozen=True, slots=True)
class SelectedPool:
    """An InferencePool a policy routes to."""

    name: str
    namespace: str
    spec: InferencePoolSpec


def secret_env_name(ref: SecretKeyRef) -> str:
    """The router's environment variable holding a Secret key (readable, collision-free)."""
    readable = re.sub(r"[^A-Z0-9]+", "_", f"{ref.name}_{ref.key}".upper()).strip("_")[:48]
    digest = hashlib.sha256(f"{ref.name}/{ref.key}".encode()).hexdigest()[:6].upper()
    return f"KVGATE_SECRET_{readable}_{digest}"


def _secret(ref: SecretKeyRef) -> rc.SecretRef:
    return rc.SecretRef(env=secret_env_name(ref))


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
            max_model_len=spec.engine.max_model_len,  # longer prompts: 400 before tokenizing
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


def _router_secrets(value: Any) -> Any:
    """A spec section as router-config input: every Secret key becomes the `SecretRef` of the
    environment variable the router container gets it in; everything else is kept as is."""
    if isinstance(value, SecretKeyRef):
        return _secret(value)
    if isinstance(value, BaseModel):
        return {name: _router_secrets(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, list):
        return [_router_secrets(v) for v in value]
    return value


def router_config(spec: RoutingPolicySpec, pools: list[SelectedPool]) -> rc.RouterConfig:
    """The router configuration; raises ValueError (pydantic) if it would be invalid.

    The policy's sections are the router's own models (`kvgate.api.sections`): they pass
    through unchanged, except that Secrets become environment variables.
    """
    return rc.RouterConfig(
        pools=[pool_config(p) for p in pools],
        classes=spec.classes,
        borrowing=spec.borrowing,
        flow_control=spec.flow_control,
        policy=spec.scoring,
        sessions=spec.sessions,
        tenants=rc.TenantsConfig.model_validate(_router_secrets(spec.tenants)),
        directory=rc.DirectoryConfig.model_validate(_router_secrets(spec.directory)),
        admin=rc.AdminConfig(
            token=_secret(spec.router.admin_token) if spec.router.admin_token else None
        ),
    )


def router_config_yaml(config: rc.RouterConfig) -> str:
    """The YAML the router reads: only values that differ from the router's defaults."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False)


def secret_env(spec: RoutingPolicySpec) -> list[JsonDict]:
    """`env` entries of the router container: one `secretKeyRef` per Secret key the config uses."""
    refs = {secret_env_name(r): r for r in secret_refs(spec)}
    return [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        for name, ref in sorted(refs.items())
    ]


def secret_refs(spec: RoutingPolicySpec) -> list[SecretKeyRef]:
    refs = [k for t in spec.tenants.tenants for k in t.api_keys]
    refs += [t.cache_salt for t in spec.tenants.tenants if t.cache_salt]
    for ref in (spec.tenants.salt_secret, spec.directory.redis.password, spec.router.admin_token):
        if ref is not None:
            refs.append(ref)
    return refs
