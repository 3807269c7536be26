"""The RoutingPolicy custom resource: a router in front of one or more InferencePools.

The operator renders a policy, together with the pools it selects, into the router's
configuration (:class:`kvgate.api.router_config.RouterConfig`) stored in a ConfigMap, and runs
the router Deployment and Service. The policy mirrors the router configuration section by
section with Kubernetes conventions (camelCase, Secrets referenced by name and key instead of
values); every default is read from the router configuration's own models, so the two cannot
drift apart.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from kvgate.api import router_config as rc
from kvgate.api.base import (
    ApiModel,
    Condition,
    FreeForm,
    PodTemplateOverrides,
    ResourceRequirements,
    SecretKeyRef,
    cel,
    section,
)
from kvgate.api.pool import PoolClass, PullPolicy

POLICY_KIND = "RoutingPolicy"
POLICY_PLURAL = "routingpolicies"

_CLASSES = rc.ClassesConfig()
_BORROWING = rc.BorrowingConfig()
_POLICY = rc.PolicyConfig()
_SESSIONS = rc.SessionsConfig()
_TENANTS = rc.TenantsConfig()
_DIRECTORY = rc.DirectoryConfig()


class PoolSelector(ApiModel):
    """Selects InferencePools of the policy's namespace by label."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Pools whose labels include all of these."
    )


class ClassRuleSpec(ApiModel):
    """A request-class rule: applies when every given condition holds; the first match wins."""

    request_class: PoolClass = Field(description="Class given to matching requests.")
    tenant: str | None = Field(default=None, description="Tenant name the request must have.")
    model: str | None = Field(default=None, description="Model the request must ask for.")
    header: str | None = Field(default=None, description="Header the request must carry.")
    header_value: str | None = Field(
        default=None, description="Required header value; unset means any value."
    )


class ClassesSpec(ApiModel):
    """How requests are classified as online or batch."""

    default: PoolClass = Field(
        default=PoolClass(_CLASSES.default), description="Class of requests no rule matches."
    )
    header: str = Field(
        default=_CLASSES.header or "",
        description=(
            "Header through which clients may ask for a class; empty disables it. It may always "
            "lower a request to batch; raise one to online only where allowed."
        ),
    )
    header_may_raise: bool = Field(
        default=_CLASSES.header_may_raise,
        description="Requests of no configured tenant may use the header to ask for online.",
    )
    rules: list[ClassRuleSpec] = Field(
        default_factory=list, description="Rules tried in order; the first match wins."
    )


class BorrowingSpec(ApiModel):
    """Batch borrowing limits: when batch requests may run on online pods."""

    enabled: bool = Field(
        default=_BORROWING.enabled, description="Let batch requests borrow idle online pods."
    )
    max_waiting_requests: int = Field(
        default=_BORROWING.max_waiting_requests,
        ge=0,
        description="An online pod is borrowable while at most this many requests wait there.",
    )
    max_kv_cache_usage: float = Field(
        default=_BORROWING.max_kv_cache_usage,
        ge=0.0,
        le=1.0,
        description="...and while its KV cache usage is at most this fraction, in [0, 1].",
    )
    max_running_requests: int = Field(
        default=_BORROWING.max_running_requests,
        ge=0,
        description="...and while it runs at most this many requests.",
    )
    online_may_use_batch_pools: bool = Field(
        default=_BORROWING.online_may_use_batch_pools,
        description="Online requests may use batch pools when no online pod is ready.",
    )


class ScoringSpec(ApiModel):
    """The scoring policy and its parameters (scorer weights, cost model)."""

    name: str = Field(
        default=_POLICY.name, min_length=1, description="Policy name in kvgate's registry."
    )
    params: FreeForm = Field(
        default_factory=dict,
        description="Policy parameters (scorer weights, cost-model constants); validated by "
        "the router when it loads its configuration.",
    )
    max_affinity_wait_seconds: float = Field(
        default=_POLICY.max_affinity_wait_seconds,
        ge=0.0,
        description="Hard cap on the extra queue delay accepted to reach a pod holding the prefix.",
    )
    seed: int | None = Field(
        default=None, description="Seed of randomised tie-breaking; unset: random."
    )


class SessionsSpec(ApiModel):
    """How a conversation is recognised across requests."""

    header: str = Field(
        default=_SESSIONS.header or "",
        description="Header carrying a session id; empty: only the OpenAI `user` field.",
    )
    use_openai_user: bool = Field(
        default=_SESSIONS.use_openai_user,
        description="Use the OpenAI `user` field as a session id.",
    )
    max_sessions: int = Field(
        default=_SESSIONS.max_sessions, ge=0, description="Sessions remembered (LRU)."
    )
    ttl_seconds: float = Field(
        default=_SESSIONS.ttl_seconds,
        gt=0.0,
        description="Idle time after which a session is forgotten.",
    )


class TenantSpec(ApiModel):
    """A tenant: API keys from Secrets, and its own cache salt."""

    name: str = Field(min_length=1, max_length=63, description="Tenant name.")
    api_keys: list[SecretKeyRef] = Field(
        default_factory=list, description="Secret keys holding this tenant's API keys."
    )
    cache_salt: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the tenant's cache_salt; default: derived."
    )
    request_class: PoolClass | None = Field(
        default=None, description="Default request class of this tenant."
    )
    may_choose_class: bool = Field(
        default=False,
        description="The class header may also raise this tenant's requests to online.",
    )


class TenantsSpec(ApiModel):
    """Tenants and their isolation: requests of different tenants never share KV blocks."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.items) || "
                    "self.items.all(a, self.items.exists_one(b, b.name == a.name))",
                    "tenant names must be unique",
                )
            ]
        }
    )

    items: list[TenantSpec] = Field(
        default_factory=list, max_length=128, description="The tenants."
    )
    unknown_key: str = Field(
        default=_TENANTS.unknown_key,
        description="Requests whose key maps to no tenant: reject (401) or anonymous.",
        json_schema_extra={"enum": ["reject", "anonymous"]},
    )
    anonymous_tenant: str = Field(
        default=_TENANTS.anonymous_tenant, description="Tenant of anonymous requests."
    )
    salt_secret: SecretKeyRef | None = Field(
        default=None, description="Secret mixed into derived salts so they cannot be guessed."
    )
    pass_client_salt: bool = Field(
        default=_TENANTS.pass_client_salt,
        description="Let a client's own cache_salt through (only without tenants).",
    )


class RedisSpec(ApiModel):
    """Connection to the Redis directory."""

    url: str = Field(
        default=_DIRECTORY.redis.url,
        min_length=1,
        description="redis:// URL without password, e.g. redis://kvgate-redis:6379/0.",
    )
    password: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the Redis password."
    )
    key_prefix: str = Field(
        default=_DIRECTORY.redis.key_prefix, min_length=1, description="Prefix of every key."
    )
    socket_timeout_seconds: float = Field(
        default=_DIRECTORY.redis.socket_timeout_seconds,
        gt=0.0,
        description="Per-call timeout; routing never waits longer on Redis.",
    )


class DirectorySpec(ApiModel):
    """Where the router keeps which pod holds which blocks."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.embeddedIndexer) || self.embeddedIndexer || "
                    "(has(self.backend) && self.backend == 'redis')",
                    "embeddedIndexer: false needs backend: redis (a separate `kvgate indexer` "
                    "can only feed a shared directory)",
                )
            ]
        }
    )

    backend: str = Field(
        default=_DIRECTORY.backend,
        description="memory (per router replica) or redis (shared by replicas and indexers).",
        json_schema_extra={"enum": ["memory", "redis"]},
    )
    redis: RedisSpec = section(RedisSpec, "Redis connection (backend redis).")
    embedded_indexer: bool = Field(
        default=_DIRECTORY.embedded_indexer,
        description="Subscribe to KV events inside the router; false runs a `kvgate indexer` "
        "Deployment that feeds the Redis directory instead.",
    )
    approximate_ttl_seconds: float = Field(
        default=_DIRECTORY.approximate_ttl_seconds,
        gt=0.0,
        description="Lifetime of routing-history entries of pods without KV events.",
    )


class RouterSpec(ApiModel):
    """The router Deployment."""

    replicas: int = Field(default=1, ge=0, description="Router pods.")
    image: str | None = Field(
        default=None, description="Router image; default: the operator's --router-image."
    )
    image_pull_policy: PullPolicy | None = Field(
        default=None, description="Always, IfNotPresent or Never."
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
                    "(has(self.poolSelector) && has(self.poolSelector.matchLabels) && "
                    "size(self.poolSelector.matchLabels) > 0)",
                    "a RoutingPolicy must name at least one pool: set spec.pools or "
                    "spec.poolSelector.matchLabels",
                )
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
    classes: ClassesSpec = section(ClassesSpec, "Request-class rules.")
    borrowing: BorrowingSpec = section(BorrowingSpec, "Batch borrowing limits.")
    scoring: ScoringSpec = section(ScoringSpec, "Scoring policy and parameters.")
    sessions: SessionsSpec = section(SessionsSpec, "Session recognition.")
    tenants: TenantsSpec = section(TenantsSpec, "Tenants.")
    directory: DirectorySpec = section(DirectorySpec, "Directory backend.")
    router: RouterSpec = section(RouterSpec, "Router Deployment settings.")


class RoutingPolicyStatus(ApiModel):
    """Observed state of a RoutingPolicy."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation last reconciled."
    )
    pools: list[str] = Field(default_factory=list, description="Pools the router serves.")
    endpoints: int = Field(default=0, description="Ready engine endpoints of those pools.")
    replicas: int = Field(default=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, description="Router pods that are ready.")
    config_hash: str = Field(default="", description="Hash of the rendered router config.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing and Degraded."
    )
