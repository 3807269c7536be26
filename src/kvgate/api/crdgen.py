"""Structural OpenAPI v3 schemas and CustomResourceDefinitions from the pydantic models.

Algorithm: take pydantic's JSON Schema of a model (camelCase aliases) and rewrite it into the
subset Kubernetes accepts for a *structural* schema:

- ``$ref`` is inlined (the referring field's own description and default win);
- ``Optional[X]`` (``anyOf: [X, null]``) becomes ``X``: absence, not ``null``, means "unset";
- ``title`` and ``additionalProperties: false`` are dropped (the API server prunes unknown fields);
- JSON Schema 2020's numeric ``exclusiveMinimum: 0`` becomes OpenAPI 3.0's
  ``minimum: 0, exclusiveMinimum: true``;
- ``default: null`` is dropped; status schemas carry no defaults at all;
- a field's default is also stated at the end of its description (:func:`default_note`),
  because ``kubectl explain`` prints descriptions but never defaults (empty objects and lists,
  the defaults of optional sections, are not stated: their fields state their own).

Anything else that a structural schema forbids (a real union, an untyped node) raises
:class:`SchemaError` at generation time, and :func:`structural_problems` re-checks the finished
schema, so that a model change that the API server would reject fails in unit tests rather than
at ``kubectl apply``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from kvgate.api.base import API_GROUP, API_VERSION, cel
from kvgate.api.policy import POLICY_KIND, POLICY_PLURAL, RoutingPolicySpec, RoutingPolicyStatus
from kvgate.api.pool import POOL_KIND, POOL_PLURAL, InferencePoolSpec, InferencePoolStatus

Schema = dict[str, Any]

_DROP = frozenset({"title", "$defs", "discriminator"})
_ALLOWED_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
_FORBIDDEN = frozenset({"anyOf", "oneOf", "allOf", "not", "$ref", "nullable", "const"})


class SchemaError(ValueError):
    """A model cannot be expressed as a structural schema."""


def default_note(value: Any) -> str:
    """The sentence appended to a field's description to state its default."""
    return f" Default: {json.dumps(value)}."


def _with_default_note(node: Schema) -> Schema:
    default = node.get("default")
    description = node.get("description")
    if default in (None, {}, []) or not description or "default" in description.lower():
        return node  # nothing to state, or the description already says it in its own words
    return {**node, "description": description + default_note(default)}


def openapi_schema(model: type[BaseModel], *, keep_defaults: bool = True) -> Schema:
    """The structural OpenAPI v3 schema of ``model`` (camelCase field names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Schema] = raw.pop("$defs", {})
    return _convert(raw, defs, keep_defaults=keep_defaults, where=model.__name__)


def _convert(node: Schema, defs: dict[str, Schema], *, keep_defaults: bool, where: str) -> Schema:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        base = _convert(target, defs, keep_defaults=keep_defaults, where=where)
        node = {**base, **node}
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v != {"type": "null"}]
        if len(variants) != 1:
            raise SchemaError(f"{where}: unions are not structural: {variants}")
        base = _convert(variants[0], defs, keep_defaults=keep_defaults, where=where)
        node = {**base, **node}
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "default" and (value is None or not keep_defaults):
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"] = value
            out["exclusiveMaximum"] = True
            continue
        if key == "properties":
            out[key] = {
                name: _with_default_note(
                    _convert(sub, defs, keep_defaults=keep_defaults, where=f"{where}.{name}")
                )
                for name, sub in value.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs, keep_defaults=keep_defaults, where=f"{where}[]")
        else:
            out[key] = value
    return out


def structural_problems(schema: Schema, path: str = "") -> list[str]:
    """Why ``schema`` is not a structural schema the API server accepts (empty when it is)."""
    return list(_problems(schema, path or "<root>"))


def _problems(node: Schema, path: str) -> Iterator[str]:
    for key in _FORBIDDEN & node.keys():
        yield f"{path}: '{key}' is not allowed"
    special = node.get("x-kubernetes-int-or-string") or node.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    kind = node.get("type")
    if kind is None and not special:
        yield f"{path}: no type"
    elif kind is not None and kind not in _ALLOWED_TYPES:
        yield f"{path}: unknown type {kind!r}"
    if "properties" in node and "additionalProperties" in node:
        yield f"{path}: properties and additionalProperties together"
    if kind == "array" and "items" not in node:
        yield f"{path}: array without items"
    if "default" in node and kind == "object" and node.get("required"):
        yield f"{path}: default on an object with required fields"
    if "enum" in node and kind not in ("string", "integer", "number"):
        yield f"{path}: enum on {kind}"
    for rule in node.get("x-kubernetes-validations", []):
        if not rule.get("rule") or not rule.get("message"):
            yield f"{path}: validation rule without rule or message"
    for name, sub in node.get("properties", {}).items():
        yield from _problems(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _problems(node[key], f"{path}[{key}]")


def _column(name: str, kind: str, path: str, description: str, priority: int = 0) -> Schema:
    column: Schema = {"name": name, "type": kind, "jsonPath": path, "description": description}
    if priority:
        column["priority"] = priority
    return column


_READY = '.status.conditions[?(@.type=="Ready")].status'
_DEGRADED = '.status.conditions[?(@.type=="Degraded")].status'
# A printer column shows only the first JSONPath match, so lists and "the reason that matters"
# are status fields of their own (set by the operator).
_REASON_COLUMNS = [
    _column("Ready", "string", _READY, "The Ready condition: True when it can serve."),
    _column("Degraded", "string", _DEGRADED, "The Degraded condition: True when it needs a fix."),
    _column("Reason", "string", ".status.reason", "Degraded's reason if degraded, else Ready's."),
]
_AGE = _column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[Schema],
    scale: bool,
    max_name_length: int,
) -> Schema:
    name_rule = cel(
        f"self.metadata.name.matches('^[a-z]([-a-z0-9]{{0,{max_name_length - 2}}}[a-z0-9])?$')",
        f"{kind} names must start with a lowercase letter, contain only lowercase letters, "
        f"digits and '-', and be at most {max_name_length} characters: the Services kvgate "
        "creates take their names from them",
    )
    root: Schema = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string", "description": "kvgate.io/v1alpha1"},
            "kind": {"type": "string", "description": kind},
            "metadata": {"type": "object"},
            "spec": openapi_schema(spec),
            "status": openapi_schema(status, keep_defaults=False),
        },
        "required": ["spec"],
        "x-kubernetes-validations": [name_rule],
    }
    subresources: Schema = {"status": {}}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "labels": {"app.kubernetes.io/name": "kvgate", "app.kubernetes.io/part-of": "kvgate"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["kvgate"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def inference_pool_crd() -> Schema:
    return _crd(
        kind=POOL_KIND,
        plural=POOL_PLURAL,
        short_names=["kvpool", "kvpools"],
        description="A fleet of vLLM engines serving one model, configured for prefix caching "
        "and KV events.",
        spec=InferencePoolSpec,
        status=InferencePoolStatus,
        scale=True,
        max_name_length=63,  # the engine Service is named after the pool
        columns=[
            _column("Model", "string", ".status.servedModelName", "Served model name."),
            _column("Class", "string", ".spec.poolClass", "online or batch."),
            _column("Desired", "integer", ".spec.replicas", "Desired engine pods."),
            _column("Ready", "integer", ".status.readyReplicas", "Ready engine pods."),
            *_REASON_COLUMNS[1:],  # the Ready column is the count of ready pods
            _column("Image", "string", ".spec.image", "Engine image.", priority=1),
            _AGE,
        ],
    )


def routing_policy_crd() -> Schema:
    return _crd(
        kind=POLICY_KIND,
        plural=POLICY_PLURAL,
        short_names=["kvpolicy", "kvpolicies"],
        description="A kvgate router in front of InferencePools: request classes, scoring, "
        "tenants and the cache directory.",
        spec=RoutingPolicySpec,
        status=RoutingPolicyStatus,
        scale=False,
        max_name_length=56,  # the router Service is <policy>-router
        columns=[
            _column("Pools", "string", ".status.poolNames", "Pools served."),
            _column("Endpoints", "integer", ".status.endpoints", "Ready engine endpoints."),
            _column("Routers", "integer", ".status.readyReplicas", "Ready router pods."),
            *_REASON_COLUMNS,
            _column("Directory", "string", ".spec.directory.backend", "Directory backend.", 1),
            _AGE,
        ],
    )


def all_crds() -> dict[str, Schema]:
    """File name (under ``crds/``) -> CRD object."""
    return {
        f"{API_GROUP}_{POOL_PLURAL}.yaml": inference_pool_crd(),
        f"{API_GROUP}_{POLICY_PLURAL}.yaml": routing_policy_crd(),
    }
