"""The Secrets and ConfigMaps a RoutingPolicy's router needs, checked before it has to start.

A router pod whose Secret (or Secret key) is missing stays in `CreateContainerConfigError`, and
one whose tokenizer ConfigMap is missing never gets its volume: the pods say so, the policy
would not. So each reconcile gets every object the policy refers to and turns the absent ones
into a Degraded reason that names them:

- `SecretMissing`: a Secret, or a key within it, named by a tenant's API keys or cache salt,
  the salt secret, the Redis password, URL or CA bundle, or the admin token;
- `ConfigMapMissing`: the tokenizer ConfigMap of a selected pool, or the ConfigMap (or its key)
  holding the Redis CA bundle.

The router Deployment is applied all the same: the kubelet starts the pods by itself once the
objects exist, and the next reconcile (the router Deployment becoming ready triggers one)
clears the condition. An object the operator may not read (an API error other than "not
found") is not reported: only a certain absence is.
"""

from __future__ import annotations

import logging

from kvgate.api.policy import RoutingPolicySpec
from kvgate.operator.kube import Kube, KubeError
from kvgate.operator.render import SelectedPool
from kvgate.operator.render.config import data_refs, secret_refs
from kvgate.operator.status import Problem

log = logging.getLogger(__name__)

SECRET_MISSING = "SecretMissing"
CONFIG_MAP_MISSING = "ConfigMapMissing"


async def missing_references(
    kube: Kube, namespace: str, spec: RoutingPolicySpec, pools: list[SelectedPool]
) -> Problem | None:
    """`SecretMissing` / `ConfigMapMissing` naming every absent object or key, else None."""
    secrets: dict[str, set[str]] = {}
    config_maps: dict[str, set[str]] = {}
    for ref in secret_refs(spec):
        secrets.setdefault(ref.name, set()).add(ref.key)
    for data in data_refs(spec):
        if data.secret is not None:
            secrets.setdefault(data.secret, set()).add(data.key)
        else:
            config_maps.setdefault(str(data.config_map), set()).add(data.key)
    tokenizer_maps = {
        pool.spec.tokenizer.config_map
        for pool in pools
        if pool.spec.tokenizer is not None and pool.spec.tokenizer.config_map is not None
    }
    for name in tokenizer_maps:
        config_maps.setdefault(name, set())
    missing_secrets: list[str] = []
    for name, keys in sorted(secrets.items()):
        if absence := await _absence(kube, "Secret", namespace, name, keys):
            missing_secrets.append(absence)
    missing_maps: list[str] = []
    for name, keys in sorted(config_maps.items()):
        hint = " (a pool's spec.tokenizer.configMap)" if name in tokenizer_maps else ""
        if absence := await _absence(kube, "ConfigMap", namespace, name, keys, hint):
            missing_maps.append(absence)
    if not missing_secrets and not missing_maps:
        return None
    reason = SECRET_MISSING if missing_secrets else CONFIG_MAP_MISSING
    message = "; ".join(missing_secrets + missing_maps)
    return Problem(reason, f"{message}: the router pods cannot start until it exists")


async def _absence(
    kube: Kube,
    kind: str,
    namespace: str,
    name: str,
    keys: set[str] | None = None,
    described_as: str = "",
) -> str | None:
    """What is absent of the `v1` object `name`: itself, or some of `keys` in its data; None
    when all is there or the object cannot be read (only a certain absence is reported)."""
    try:
        found = await kube.get("v1", kind, namespace, name)
    except KubeError as exc:
        log.debug("cannot check %s %s/%s: %s", kind, namespace, name, exc.message)
        return None
    if found is None:
        return f"{kind} {name}{described_as} not found in namespace {namespace}"
    absent = sorted((keys or set()) - set((found.get("data") or {}).keys()))
    return f"{kind} {name} has no key {', '.join(absent)}" if absent else None


def combined(first: Problem | None, second: Problem | None) -> Problem | None:
    """Both problems in one: the first one's reason, both messages."""
    if first is None or second is None:
        return first or second
    return Problem(first.reason, f"{first.message}; {second.message}")
