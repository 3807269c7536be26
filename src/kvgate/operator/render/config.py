"""RoutingPolicy + its InferencePools -> the router's typed configuration (pure).

`router_config` translates the policy (Kubernetes conventions) and each selected pool into
:class:`kvgate.api.router_config.RouterConfig`, which validates the result: the router loads
exactly what the operator renders. Secrets are never copied: the config names an environment
variable that the router container fills from the Secret key (`secretKeyRef`); other data
(the Redis CA bundle) likewise from a Secret or ConfigMap key (`configMapKeyRef`). A pool's
tokenizer ConfigMap is referenced by its mount path, and each pool's engines by the
EndpointSlices of its Service (named after the pool).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from kvgate.api import router_config as rc
from kvgate.api.base import DataKeyRef, JsonDict, SecretKeyRef
from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec

TOKENIZERS_DIR = "/var/lib/kvgate/tokenizers"


@dataclass(frozen=True, slots=True)
class GatewayTarget:
    """Where a Gateway API InferencePool's engines are: the headless Service the operator renders
    for them (`kvgate.operator.render.gateway`)."""

    service: str
    selector: dict[str, str]
    port: int
    kv_events: bool
    api_key: SecretKeyRef | None = None  # the engines' --api-key


@dataclass(frozen=True, slots=True)
class SelectedPool:
    """An InferencePool a policy routes to: kvgate's own, or (with `gateway`) one of the Gateway
    API Inference Extension, its engines described by the policy's reference."""

    name: str
    namespace: str
    spec: InferencePoolSpec
    gateway: GatewayTarget | None = None

    @property
    def service(self) -> str:
        """The Service whose EndpointSlices list the pool's engines."""
        return self.gateway.service if self.gateway is not None else self.name


def secret_env_name(ref: SecretKeyRef) -> str:
    """The router's environment variable holding a Secret key (readable, collision-free)."""
    readable = re.sub(r"[^A-Z0-9]+", "_", f"{ref.name}_{ref.key}".upper()).strip("_")[:48]
    digest = hashlib.sha256(f"{ref.name}/{ref.key}".encode()).hexdigest()[:6].upper()
    return f"KVGATE_SECRET_{readable}_{digest}"


def _secret(ref: SecretKeyRef) -> rc.SecretRef:
    return rc.SecretRef(env=secret_env_name(ref))


def data_env_name(ref: DataKeyRef) -> str:
    """The router's environment variable holding a Secret's or a ConfigMap's key."""
    if ref.secret is not None:
        return secret_env_name(SecretKeyRef(name=ref.secret, key=ref.key))
    readable = re.sub(r"[^A-Z0-9]+", "_", f"{ref.config_map}_{ref.key}".upper()).strip("_")[:48]
    digest = hashlib.sha256(f"configmap/{ref.config_map}/{ref.key}".encode()).hexdigest()[:6]
    return f"KVGATE_CONFIG_{readable}_{digest.upper()}"


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
    # What the engines render chat with beyond the template: the router must render the same.
    args = pool.spec.engine.extra_args
    kwargs = _flag_json(args, "--default-chat-template-kwargs")
    if isinstance(kwargs, dict):
        extra["default_chat_template_kwargs"] = kwargs
    efforts = _flag_json(args, "--reasoning-effort-map")
    if isinstance(efforts, dict) and all(isinstance(v, str) for v in efforts.values()):
        extra["reasoning_effort_map"] = efforts
    return rc.TokenizerConfig(path=path, chat_template=chat_template, **extra)


def _flag_json(args: list[str], flag: str) -> Any:
    """The JSON value of `flag` among `vllm serve` arguments (`--flag VALUE` or `--flag=VALUE`;
    the last one, as argparse takes it); None when absent or not JSON (the engine refuses it)."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    if found is None:
        return None
    try:
        return json.loads(found)
    except ValueError:
        return None


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
            kv_events=pool.gateway.kv_events if pool.gateway is not None else True,
            cpu_offload=spec.engine.cpu_offload_gib is not None,
            cache_ops=spec.cache.cache_ops,
            api_key=_secret(pool.gateway.api_key)
            if pool.gateway is not None and pool.gateway.api_key is not None
            else None,
        ),
        endpoints=rc.EndpointsConfig(
            kubernetes=rc.KubernetesDiscovery(namespace=pool.namespace, service=pool.service)
        ),
        lora_adapters=[
            rc.LoraAdapter(name=a.name, path=a.path)
            for a in (spec.lora.adapters if spec.lora else [])
        ],
    )


def _router_secrets(value: Any) -> Any:
    """A spec section as router-config input: every Secret key becomes the `SecretRef` of the
    environment variable the router container gets it in (a Secret's or ConfigMap's key
    too); everything else is kept as is."""
    if isinstance(value, SecretKeyRef):
        return _secret(value)
    if isinstance(value, DataKeyRef):
        return rc.SecretRef(env=data_env_name(value))
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
        cache_ops=spec.cache_ops,
        warmup=spec.warmup,
        load_sharing=spec.load_sharing,
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
    """`env` entries of the router container: one `secretKeyRef` per Secret key the config uses
    and one `configMapKeyRef` per ConfigMap key."""
    sources: dict[str, JsonDict] = {
        secret_env_name(r): {"secretKeyRef": {"name": r.name, "key": r.key}}
        for r in secret_refs(spec)
    }
    for ref in data_refs(spec):
        if ref.secret is not None:
            sources[data_env_name(ref)] = {"secretKeyRef": {"name": ref.secret, "key": ref.key}}
        else:
            source = {"name": str(ref.config_map), "key": ref.key}
            sources[data_env_name(ref)] = {"configMapKeyRef": source}
    return [{"name": name, "valueFrom": source} for name, source in sorted(sources.items())]


def data_refs(spec: RoutingPolicySpec) -> list[DataKeyRef]:
    return [r for r in (spec.directory.redis.ca_bundle,) if r is not None]


def secret_refs(spec: RoutingPolicySpec) -> list[SecretKeyRef]:
    refs = [k for t in spec.tenants.tenants for k in t.api_keys]
    refs += [r.api_key for r in spec.pool_refs if r.api_key is not None]
    refs += [t.cache_salt for t in spec.tenants.tenants if t.cache_salt]
    redis = spec.directory.redis
    for ref in (
        spec.tenants.salt_secret,
        redis.password,
        redis.url_secret,
        spec.router.admin_token,
    ):
        if ref is not None:
            refs.append(ref)
    return refs
