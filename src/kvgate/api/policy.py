"""The RoutingPolicy custom resource: a router in front of one or more InferencePools.

The operator renders a policy, together with the pools it selects, into the router's
configuration (:class:`kvgate.api.router_config.RouterConfig`) stored in a ConfigMap, and runs
the router Deployment and Service. The sections the router's configuration also has (classes,
borrowing, scoring, sessions, tenants, directory) are the same models
(`kvgate.api.sections`), spelled in camelCase here and with Secrets named by name and key
(`SecretKeyRef`) instead of values; only the pool selection and the router Deployment
(`RouterSpec`) are the policy's own.

Besides kvgate's own InferencePools (`pools`, `poolSelector`), a policy may route to InferencePools
of the Gateway API Inference Extension (`poolRefs`, group `inference.networking.k8s.io`): those
declare only which pods serve (a label selector and a target port), so the reference also says
what kvgate must know of their engines to compute matching block hashes.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, WithJsonSchema

from kvgate.api.base import (
    INT32_MAX,
    ApiModel,
    Condition,
    DataKeyRef,
    ObjectName,
    PodTemplateOverrides,
    ResourceRequirements,
    SecretKeyRef,
    cel,
    section,
)
from kvgate.api.directory_settings import DirectorySettings, RedisSettings
from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
from kvgate.api.pool import (
    BLOCK_SIZES,
    CacheSettings,
    LoraAdapterSpec,
    PoolClass,
    PullPolicy,
    TokenizerSource,
)
from kvgate.api.sections import (
    BorrowingConfig,
    CacheOpsConfig,
    ClassesConfig,
    FlowControlConfig,
    PolicyConfig,
    SessionsConfig,
)
from kvgate.api.tenants import TenantSettings, TenantsSettings

POLICY_KIND = "RoutingPolicy"
POLICY_PLURAL = "routingpolicies"
GATEWAY_INFERENCE_GROUP: Final = "inference.networking.k8s.io"
GATEWAY_INFERENCE_VERSION = "v1"


class PoolSelector(ApiModel):
    """Selects InferencePools of the policy's namespace by label."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Pools whose labels include all of these."
    )


class GatewayPoolRef(ApiModel):
    """A Gateway API Inference Extension InferencePool of the policy's namespace, and what its
    engines do that kvgate must reproduce (the pool itself declares only selector and ports)."""

    group: Annotated[
        Literal["inference.networking.k8s.io"],
        WithJsonSchema({"type": "string", "enum": [GATEWAY_INFERENCE_GROUP]}),
    ] = Field(default=GATEWAY_INFERENCE_GROUP, description="API group of the referenced pool.")
    kind: Annotated[
        Literal["InferencePool"], WithJsonSchema({"type": "string", "enum": ["InferencePool"]})
    ] = Field(default="InferencePool", description="Kind of the referenced pool.")
    name: ObjectName = Field(
        description="Name of the InferencePool (inference.networking.k8s.io/v1).",
    )
    model: str = Field(
        min_length=1,
        max_length=253,
        description="Model name the pool's engines serve (--served-model-name).",
    )
    pool_class: PoolClass = Field(
        default=PoolClass.ONLINE, description="Traffic class served: online or batch."
    )
    block_size: int = Field(
        default=16,
        ge=1,
        le=256,
        description="The engines' --block-size.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"self in {list(BLOCK_SIZES)}", "blockSize must be a power of two, 1 to 256")
            ]
        },
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="The engines' --max-model-len (longer prompts: 400)."
    )
    cache: CacheSettings = section(CacheSettings, "The engines' prefix-cache hashing.")
    tokenizer: TokenizerSource | None = Field(
        default=None, description="Tokenizer of the model; default: approximate blocks."
    )
    kv_events: bool = Field(
        default=False,
        description="The engines publish vLLM KV events on port 5557 (replay 5558) under the "
        "topic kv@<pod IP>@<model>; without them kvgate learns from its own routing history.",
    )
    lora_adapters: list[LoraAdapterSpec] = Field(
        default_factory=list,
        max_length=256,
        description="LoRA adapters the engines serve (their --lora-modules name=path).",
    )
    api_key: SecretKeyRef | None = Field(
        default=None,
        description="Key of a Secret holding the engines' API key (their --api-key): the "
        "router sends it as Authorization: Bearer on every request to them. Default: none.",
    )


# The sections shared with the router's configuration, with Secrets named by name and key.
TenantSpec = TenantSettings[SecretKeyRef]
TenantsSpec = TenantsSettings[SecretKeyRef]
RedisSpec = RedisSettings[SecretKeyRef, DataKeyRef]
DirectorySpec = DirectorySettings[SecretKeyRef, DataKeyRef]


class RouterSpec(ApiModel):
    """The router Deployment."""

    replicas: int = Field(default=1, ge=0, le=INT32_MAX, description="Router pods.")
    image: str | None = Field(
        default=None, description="Router image; default: the operator's --router-image."
    )
    image_pull_policy: PullPolicy | None = Field(
        default=None,
        description="Image pull policy of the router: Always, IfNotPresent or Never; unset: the "
        "cluster's default.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Router container resources."
    )
    pod: PodTemplateOverrides = Field(
        default_factory=PodTemplateOverrides, description="Router pod metadata and scheduling."
    )
    log_level: str = Field(
        default="INFO",
        description="Router log level.",
        json_schema_extra={"enum": ["DEBUG", "INFO", "WARNING", "ERROR"]},
    )
    admin_token: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the bearer token of /admin/*."
    )
    service_type: str = Field(
        default="ClusterIP",
        description="Type of the router Service.",
        json_schema_extra={"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
    )


class RoutingPolicySpec(ApiModel):
    """Desired state of a RoutingPolicy."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.pools) && size(self.pools) > 0) || "
                    "(has(self.poolRefs) && size(self.poolRefs) > 0) || "
                    "(has(self.poolSelector) && has(self.poolSelector.matchLabels) && "
                    "size(self.poolSelector.matchLabels) > 0)",
                    "a RoutingPolicy must name at least one pool: set spec.pools, spec.poolRefs "
                    "or spec.poolSelector.matchLabels",
                ),
                cel(
                    "!has(self.loadSharing) || !has(self.loadSharing.enabled) || "
                    "!self.loadSharing.enabled || "
                    "(has(self.directory) && has(self.directory.backend) && "
                    "self.directory.backend == 'redis')",
                    "loadSharing.enabled: true needs directory.backend: redis (replicas "
                    "exchange load through the directory's Redis; left unset, loadSharing is "
                    "on exactly when the directory is Redis)",
                ),
                cel(
                    "!has(self.warmup) || !has(self.warmup.shared) || !self.warmup.shared || "
                    "(has(self.directory) && has(self.directory.backend) && "
                    "self.directory.backend == 'redis')",
                    "warmup.shared: true needs directory.backend: redis (replicas share "
                    "warm-ups through the directory's Redis; left unset, they do exactly when "
                    "the directory is Redis)",
                ),
            ]
        }
    )

    pools: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="InferencePools (same namespace) this router serves.",
        json_schema_extra={"items": {"type": "string", "minLength": 1, "maxLength": 253}},
    )
    pool_selector: PoolSelector | None = Field(
        default=None, description="Also serve the pools whose labels match."
    )
    pool_refs: list[GatewayPoolRef] = Field(
        default_factory=list,
        max_length=64,
        description="Gateway API Inference Extension InferencePools this router also serves.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.all(a, self.exists_one(b, a.name == b.name))",
                    "poolRefs must name each InferencePool once",
                )
            ]
        },
    )
    classes: ClassesConfig = section(ClassesConfig, "Request-class rules.")
    borrowing: BorrowingConfig = section(BorrowingConfig, "Batch borrowing limits.")
    flow_control: FlowControlConfig = section(
        FlowControlConfig, "Queueing while pods are saturated: limits, deadlines."
    )
    scoring: PolicyConfig = section(PolicyConfig, "Scoring policy and parameters.")
    sessions: SessionsConfig = section(SessionsConfig, "Session recognition.")
    cache_ops: CacheOpsConfig = section(CacheOpsConfig, "AKV cache ops the router adds.")
    tenants: TenantsSpec = section(TenantsSpec, "Tenants.")
    directory: DirectorySpec = section(DirectorySpec, "Directory backend.")
    warmup: WarmupConfig = section(WarmupConfig, "Warm-up of pods that join a pool.")
    load_sharing: LoadSharingConfig = section(
        LoadSharingConfig, "Load shared between the router's replicas."
    )
    router: RouterSpec = section(RouterSpec, "Router Deployment settings.")


class RoutingPolicyStatus(ApiModel):
    """Observed state of a RoutingPolicy."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation last reconciled."
    )
    pools: list[str] = Field(default_factory=list, description="Pools the router serves.")
    pool_names: str = Field(
        default="",
        description="The same pools as one comma-separated string (the Pools column of kubectl "
        "get, which cannot print a list).",
    )
    endpoints: int = Field(default=0, description="Ready engine endpoints of those pools.")
    replicas: int = Field(default=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, description="Router pods that are ready.")
    config_hash: str = Field(default="", description="Hash of the rendered router config.")
    conditions: list[Condition] = Field(
        default_factory=list, description="The conditions Ready, Progressing and Degraded."
    )
    reason: str = Field(
        default="",
        description="Why it is (not) ready, in one word: the Degraded condition's reason while "
        "Degraded is True, else the Ready condition's (the Reason column of kubectl get).",
    )
