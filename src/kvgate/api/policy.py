"""The RoutingPolicy custom resource: a router in front of one or more InferencePools.

The operator renders a policy, together with the pools it selects, into the router's
configuration (:class:`kvgate.api.router_config.RouterConfig`) stored in a ConfigMap, and runs
the router Deployment and Service. The sections the router's configuration also has (classes,
borrowing, scoring, sessions, tenants, directory) are the same models
(`kvgate.api.sections`), spelled in camelCase here and with Secrets named by name and key
(`SecretKeyRef`) instead of values; only the pool selection and the router Deployment
(`RouterSpec`) are the policy's own.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from kvgate.api.base import (
    ApiModel,
    Condition,
    PodTemplateOverrides,
    ResourceRequirements,
    SecretKeyRef,
    cel,
    section,
)
from kvgate.api.pool import PullPolicy
from kvgate.api.sections import (
    BorrowingConfig,
    ClassesConfig,
    DirectorySettings,
    FlowControlConfig,
    PolicyConfig,
    RedisSettings,
    SessionsConfig,
    TenantSettings,
    TenantsSettings,
)

POLICY_KIND = "RoutingPolicy"
POLICY_PLURAL = "routingpolicies"


class PoolSelector(ApiModel):
    """Selects InferencePools of the policy's namespace by label."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Pools whose labels include all of these."
    )


# The sections shared with the router's configuration, with Secrets named by name and key.
TenantSpec = TenantSettings[SecretKeyRef]
TenantsSpec = TenantsSettings[SecretKeyRef]
RedisSpec = RedisSettings[SecretKeyRef]
DirectorySpec = DirectorySettings[SecretKeyRef]


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
    classes: ClassesConfig = section(ClassesConfig, "Request-class rules.")
    borrowing: BorrowingConfig = section(BorrowingConfig, "Batch borrowing limits.")
    flow_control: FlowControlConfig = section(
        FlowControlConfig, "Queueing while pods are saturated: limits, deadlines."
    )
    scoring: PolicyConfig = section(PolicyConfig, "Scoring policy and parameters.")
    sessions: SessionsConfig = section(SessionsConfig, "Session recognition.")
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
