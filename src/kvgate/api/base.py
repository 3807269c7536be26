"""Building blocks shared by the kvgate custom resources.

Every CRD model derives from :class:`ApiModel`: camelCase field names on the wire (Kubernetes
convention), snake_case in Python, unknown fields rejected (a typo in an example or a test fails
loudly instead of being silently pruned). Types that the CRD schema must express in a
Kubernetes-specific way carry their OpenAPI fragment with them (``Quantity`` is
``x-kubernetes-int-or-string``; ``FreeForm`` preserves unknown fields), so that the generator in
:mod:`kvgate.api.crdgen` stays a mechanical translation.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

API_GROUP = "kvgate.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

JsonDict = dict[str, Any]
"""A JSON object (a schema fragment, a Kubernetes object)."""

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
PERCENT_PATTERN = r"^(100|[0-9]{1,2})%$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
INT32_MAX = 2**31 - 1


def _matching(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: int | str) -> int | str:
        if isinstance(value, str) and not compiled.match(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


Quantity = Annotated[
    int | str,
    _matching(QUANTITY_PATTERN, "a Kubernetes quantity"),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "description": "A Kubernetes quantity such as 4, 500m, 16Gi.",
        }
    ),
]
"""A Kubernetes resource quantity (``4``, ``"500m"``, ``"16Gi"``)."""


def _count_or_percent(value: int | str) -> int | str:
    if isinstance(value, str) and not re.match(PERCENT_PATTERN, value):
        raise ValueError(f"{value!r} is not a percentage from 0% to 100%")
    if isinstance(value, int) and not 0 <= value <= INT32_MAX:
        raise ValueError(f"{value} is not a count from 0 to {INT32_MAX}")
    return value


IntOrPercent = Annotated[
    int | str,
    AfterValidator(_count_or_percent),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": PERCENT_PATTERN,  # strings only
            "minimum": 0,  # integers only
            "maximum": INT32_MAX,
        }
    ),
]
"""A count or a percentage (``1``, ``"25%"``), as in a PodDisruptionBudget: the API server
refuses a negative count or a percentage over 100%, and with it every later change of the
pool's children (they are applied in order)."""

ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""The name of an object in the resource's namespace (a Secret, a ConfigMap): a DNS subdomain,
so that it names nothing else when put in an API path (``../../kube-system/secrets/x`` read
another namespace's Secret with the operator's rights)."""

FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""An object whose fields the schema does not constrain (plugin parameters)."""


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One ``x-kubernetes-validations`` entry: a CEL rule and the message shown on rejection."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def section(model: type[BaseModel], description: str) -> Any:
    """A nested spec section that may be omitted: it defaults to `model()`, and its schema
    carries ``default: {}`` so that the API server also fills in the section's own defaults."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class ApiModel(BaseModel):
    """Base of every CRD model: camelCase aliases, strict about unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A standard Kubernetes condition (``metav1.Condition``)."""

    type: str = Field(description="Condition type: Ready, Progressing or Degraded.")
    status: ConditionStatus = Field(description="Condition status: True, False or Unknown.")
    reason: str = Field(
        default="", description="CamelCase machine-readable reason for the last transition."
    )
    message: str = Field(default="", description="Human-readable detail, what to fix.")
    last_transition_time: str | None = Field(
        default=None, description="RFC 3339 time of the last status change."
    )
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )


class ResourceRequirements(ApiModel):
    """Compute resources of a container, as in ``corev1.ResourceRequirements``."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: 4, memory: 32Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Maximum resources; extended resources such as nvidia.com/gpu go here.",
    )


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class Toleration(ApiModel):
    """A pod toleration, as in ``corev1.Toleration``."""

    key: str | None = Field(default=None, description="Taint key; empty matches all keys.")
    operator: TolerationOperator | None = Field(
        default=None, description="How the taint key matches: Exists (any value) or Equal (value)."
    )
    value: str | None = Field(default=None, description="Taint value for operator Equal.")
    effect: str | None = Field(
        default=None,
        description="Taint effect tolerated: NoSchedule, PreferNoSchedule or NoExecute; empty "
        "matches all.",
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class EnvVar(ApiModel):
    """A plain environment variable for a container."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: ObjectName = Field(description="Secret name (same namespace).")
    key: str = Field(min_length=1, description="Key within the Secret.")


class DataKeyRef(ApiModel):
    """A key of a Secret or of a ConfigMap in the resource's namespace (data that need not be
    secret, such as a CA bundle, often lives in a ConfigMap)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.secret) != has(self.configMap)",
                    "give exactly one of secret and configMap",
                )
            ]
        }
    )

    secret: ObjectName | None = Field(default=None, description="Secret name.")
    config_map: ObjectName | None = Field(default=None, description="ConfigMap name.")
    key: str = Field(min_length=1, description="Key within it.")

    @model_validator(mode="after")
    def _exactly_one(self) -> DataKeyRef:
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("give exactly one of secret and configMap")
        return self


class PodTemplateOverrides(ApiModel):
    """Metadata and scheduling settings passed through to the pods kvgate creates."""

    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels on the pods (kvgate's own labels win)."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra annotations on the pods."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must run on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the pods tolerate."
    )
    priority_class_name: ObjectName | None = Field(
        default=None, description="PriorityClass of the pods."
    )
    service_account_name: ObjectName | None = Field(
        default=None, description="ServiceAccount the pods run as."
    )
