"""The `tenants` section, shared by the router's config file and the RoutingPolicy CRD (the
conventions of `kvgate.api.sections`): who a request belongs to, its own cache salt, and its
place in the router's queues."""

from __future__ import annotations

from typing import Generic, Literal

from pydantic import ConfigDict, Field, model_validator

from kvgate.api.base import cel
from kvgate.api.sections import ConfigModel, RequestClass, SecretT


class TenantSettings(ConfigModel, Generic[SecretT]):
    """A tenant: its API keys and the `cache_salt` the router injects into its requests."""

    # A parametrised generic has no docstring of its own: the schema's description goes here.
    model_config = ConfigDict(
        json_schema_extra={"description": "A tenant: API keys, and its own cache salt."}
    )

    name: str = Field(min_length=1, max_length=63, description="Tenant name.")
    api_keys: list[SecretT] = Field(
        default_factory=list,
        max_length=16,
        description="This tenant's API keys (secrets); at most 16 (enough to rotate them).",
    )
    cache_salt: SecretT | None = Field(
        default=None,
        description="The tenant's cache_salt (a secret); default: derived from the salt secret "
        "and the tenant's name.",
    )
    request_class: RequestClass | None = Field(
        default=None, description="Default request class of this tenant's requests."
    )
    may_choose_class: bool = Field(
        default=False,
        description="The class header may also raise this tenant's requests to online, over the "
        "rules and its class (default false: the header can only lower them to batch).",
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Queued requests of a higher-priority tenant leave first, within a class "
        "(online always before batch); default 0.",
    )
    weight: float = Field(
        default=1.0,
        gt=0.0,
        le=1000.0,
        description="The tenant's share of a queue among tenants of its priority, in prompt "
        "tokens (fair queueing); default 1.",
    )


class TenantsSettings(ConfigModel, Generic[SecretT]):
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

    # `items` in a RoutingPolicy (its name since v1alpha1), `tenants` in the router's file.
    tenants: list[TenantSettings[SecretT]] = Field(
        default_factory=list, max_length=128, alias="items", description="The tenants."
    )
    unknown_key: Literal["reject", "anonymous"] = Field(
        default="anonymous",
        description="Requests whose key maps to no tenant: reject (401) or anonymous (the "
        "shared anonymous tenant).",
    )
    anonymous_tenant: str = Field(default="anonymous", description="Tenant of anonymous requests.")
    salt_secret: SecretT | None = Field(
        default=None, description="Secret mixed into derived salts so they cannot be guessed."
    )
    pass_client_salt: bool = Field(
        default=True,
        description="Let a client's own cache_salt through (only when no tenants are configured).",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> TenantsSettings[SecretT]:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        return self
