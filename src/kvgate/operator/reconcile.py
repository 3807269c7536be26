"""The operator's logic, independent of kopf: reconcile pools and policies, finalize pools.

`reconcile_pool` and `reconcile_policy` are idempotent: parse the spec into the pydantic model,
render every child with the pure builders, server-side apply them all (which also undoes drift:
an edited child gets its fields back, a deleted one is recreated), read back what the cluster
reports and write the status. They never raise for problems a person must fix: an invalid spec,
a missing pool, Secret or ConfigMap (:mod:`kvgate.operator.references`) or a failed API call
becomes a `Degraded` condition with a readable message and a Warning event (posted once per new
problem, not on every resync), and the next resync tries again. Calls for the same object are serialised by a per-object lock, because handlers, the
resync daemon and child watches may all ask for the same reconcile at once.

A pool change cascades to the policies that select it (their router config and endpoint counts
depend on it). Deleting a pool clears its entries from every Redis directory of a policy that
selected it, with a bounded timeout (:mod:`kvgate.operator.cleanup`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from kvgate import __version__
from kvgate.api.base import GROUP_VERSION, DataKeyRef, JsonDict
from kvgate.api.policy import POLICY_KIND, RoutingPolicySpec
from kvgate.api.pool import POOL_KIND, InferencePoolSpec
from kvgate.operator import cleanup
from kvgate.operator.kube import Kube, KubeError
from kvgate.operator.references import combined, missing_references
from kvgate.operator.render import (
    Owner,
    SelectedPool,
    engine_selector_string,
    policy_children,
    pool_children,
)
from kvgate.operator.render.common import FIELD_MANAGER
from kvgate.operator.render.gateway import GATEWAY_POOL_API_VERSION, GATEWAY_POOL_KIND, gateway_pool
from kvgate.operator.render.router import indexer_name, needs_indexer, router_name
from kvgate.operator.status import Problem, Rollout, policy_status, pool_status

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Posts a Kubernetes Event about `body`; never raises (a lost event is only logged)."""

    async def __call__(self, body: JsonDict, *, type: str, reason: str, message: str) -> None: ...


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """Knobs of the operator (`kvgate operator` flags)."""

    router_image: str = f"ghcr.io/kvgate/kvgate:{__version__}"
    resync_seconds: float = 30.0
    cleanup_timeout_seconds: float = 5.0
    namespaces: tuple[str, ...] = ()  # watched namespaces; empty: all


def describe(exc: ValidationError) -> str:
    """A pydantic error as one line a person can act on: `field.path: what is wrong; ...`."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _meta(body: JsonDict) -> JsonDict:
    meta: JsonDict = body.get("metadata") or {}
    return meta


def selects(policy: RoutingPolicySpec, pool: JsonDict) -> bool:
    name = _meta(pool).get("name")
    if name in policy.pools:
        return True
    selector = policy.pool_selector
    if selector is None or not selector.match_labels:
        return False
    labels = _meta(pool).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.match_labels.items())


class Reconciler:
    """Reconciles InferencePools and RoutingPolicies through a `Kube`."""

    def __init__(
        self,
        kube: Kube,
        events: EventSink,
        settings: OperatorSettings,
        *,
        clock: Callable[[], str] = utc_now,
        clear_pool: Callable[..., Awaitable[int]] = cleanup.clear_pool,
    ) -> None:
        self.kube = kube
        self.events = events
        self.settings = settings
        self._clock = clock
        self._clear_pool = clear_pool
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._problems: dict[tuple[str, str, str], Problem | None] = {}
        self._advised: dict[tuple[str, str, str], str | None] = {}
        self._absent: set[tuple[str, str, str]] = set()  # missing from the last resync

    def _lock(self, kind: str, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((kind, namespace, name), asyncio.Lock())

    async def _report(self, body: JsonDict, owner: Owner, problem: Problem | None) -> None:
        """Post a Warning when a new problem appears, a Normal event when it is resolved."""
        key = (owner.kind, owner.namespace, owner.name)
        before = self._problems.get(key)
        self._problems[key] = problem
        if problem == before:
            return
        if problem is not None:
            log.warning("%s %s/%s: %s", owner.kind, owner.namespace, owner.name, problem.message)
            await self.events(body, type="Warning", reason=problem.reason, message=problem.message)
        elif before is not None:
            await self.events(body, type="Normal", reason="Reconciled", message="problem resolved")

    async def _advise(self, body: JsonDict, owner: Owner, advice: str | None) -> None:
        """Post a Warning when a working but unwise setting appears (once, not every resync)."""
        key = (owner.kind, owner.namespace, owner.name)
        if self._advised.get(key) == advice:
            return
        self._advised[key] = advice
        if advice is not None:
            log.warning("%s %s/%s: %s", owner.kind, owner.namespace, owner.name, advice)
            await self.events(body, type="Warning", reason="LoadNotShared", message=advice)

    async def _apply_all(
        self, children: list[JsonDict]
    ) -> tuple[dict[tuple[str, str], JsonDict], Problem | None]:
        """Apply `children` in order; what was applied, by kind and name."""
        applied: dict[tuple[str, str], JsonDict] = {}
        for child in children:
            kind, name = child["kind"], child["metadata"]["name"]
            holder = await self._other_owner(child)
            if holder is not None:
                message = f"{kind} {name} belongs to {holder}: rename one of the two"
                return applied, Problem("NameTaken", message)
            try:
                applied[kind, name] = await self.kube.apply(child)
            except KubeError as exc:
                return applied, Problem("ApplyFailed", f"cannot apply {kind} {name}: {exc.message}")
        return applied, None

    async def _other_owner(self, child: JsonDict) -> str | None:
        """The kind and name of another resource that controls the object `child` would
        replace (a pool `foo-router` and a policy `foo` both make a `foo-router`: forced, each
        apply took the other's Service and Deployment over), else None. The same resource
        made again (another uid) takes its old children over."""
        meta = child["metadata"]
        existing = await self._get(
            child["apiVersion"], child["kind"], meta["namespace"], meta["name"]
        )
        if existing is None:
            return None
        mine, theirs = _controller(child), _controller(existing)
        if theirs is None:  # an orphan of kvgate's own is taken back; anyone else's is not
            managers = {f.get("manager") for f in _meta(existing).get("managedFields") or []}
            return None if FIELD_MANAGER in managers else "an object kvgate did not make"
        fields = ("apiVersion", "kind", "name")
        if mine is None or all(theirs.get(f) == mine.get(f) for f in fields):
            return None
        return f"{theirs.get('kind')} {theirs.get('name')}"

    async def _get(self, api_version: str, kind: str, namespace: str, name: str) -> JsonDict | None:
        try:
            return await self.kube.get(api_version, kind, namespace, name)
        except KubeError:
            return None

    async def _write_status(self, body: JsonDict, owner: Owner, status: JsonDict) -> None:
        if body.get("status") and all(body["status"].get(k) == v for k, v in status.items()):
            return
        try:
            await self.kube.patch_status(
                GROUP_VERSION, owner.kind, owner.namespace, owner.name, status
            )
        except KubeError as exc:
            log.warning("cannot write status of %s %s: %s", owner.kind, owner.name, exc.message)

    # -- pools ---------------------------------------------------------------------------------

    async def reconcile_pool(
        self, body: JsonDict, *, cascade: bool = True, reread: bool = False
    ) -> JsonDict | None:
        """Apply a pool's children and write its status; returns the status written.
        `reread`: `body` may be old (a list the resync took a while ago), read it again."""
        owner = Owner.from_body(body)
        if _meta(body).get("deletionTimestamp"):
            return None
        async with self._lock(owner.kind, owner.namespace, owner.name):
            current = await self._current(owner) if reread else body
            if current is None:
                return None
            status = await self._reconcile_pool(current, Owner.from_body(current))
        if cascade:
            await self.reconcile_policies_of_pool(owner.namespace, owner.name)
        return status

    async def _reconcile_pool(self, body: JsonDict, owner: Owner) -> JsonDict:
        problem: Problem | None = None
        spec: InferencePoolSpec | None = None
        deployment: JsonDict | None = None
        try:
            spec = InferencePoolSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            problem = Problem("InvalidSpec", describe(exc))
        if spec is not None:
            applied, problem = await self._apply_all(pool_children(owner, spec))
            deployment = applied.get(("Deployment", owner.name))
        if deployment is None:
            deployment = await self._own_deployment(owner, owner.name)
        await self._report(body, owner, problem)
        desired = (
            spec.replicas
            if spec is not None
            else int((body.get("spec") or {}).get("replicas") or 0)
        )
        status = pool_status(
            rollout=Rollout.from_deployment(deployment, desired),
            problem=problem,
            generation=owner.generation,
            selector=engine_selector_string(owner.name),
            served_model_name=spec.served_name if spec is not None else "",
            previous=body.get("status") or {},
            now=self._clock(),
        )
        await self._write_status(body, owner, status)
        return status

    async def finalize_pool(self, body: JsonDict) -> None:
        """Clear a deleted pool from the Redis directories of the policies that selected it."""
        owner = Owner.from_body(body)
        pool_key = f"{owner.namespace}/{owner.name}"
        targets: dict[cleanup.RedisTarget, None] = {}
        try:
            for policy in await self._policies_selecting(owner.namespace, body):
                spec = RoutingPolicySpec.model_validate(policy.get("spec") or {})
                if spec.directory.backend == "redis":
                    targets[await self._redis_target(owner.namespace, spec)] = None
        except (KubeError, ValidationError, ValueError) as exc:
            message = f"cannot find the directories of pool {pool_key}: {exc}"
            await self.events(
                body, type="Warning", reason="DirectoryCleanupFailed", message=message
            )
            log.warning(message)
        for target in targets:
            try:
                pods = await self._clear_pool(
                    target, pool_key, timeout_seconds=self.settings.cleanup_timeout_seconds
                )
            except Exception as exc:  # Redis down, timeout, auth: never block the deletion
                message = (
                    f"could not clear directory entries of {pool_key} at {target.display_url}: "
                    f"{type(exc).__name__}: {exc}; stale entries expire or are replaced"
                )
                log.warning(message)
                await self.events(
                    body, type="Warning", reason="DirectoryCleanupFailed", message=message
                )
            else:
                message = (
                    f"cleared {pods} pods of {pool_key} from the directory at {target.display_url}"
                )
                await self.events(body, type="Normal", reason="DirectoryCleared", message=message)
        self._problems.pop((owner.kind, owner.namespace, owner.name), None)
        self._locks.pop((owner.kind, owner.namespace, owner.name), None)

    async def _redis_target(self, namespace: str, spec: RoutingPolicySpec) -> cleanup.RedisTarget:
        redis = spec.directory.redis
        password = url = ca_pem = None
        if redis.password is not None:
            password = await self._secret_value(namespace, redis.password.name, redis.password.key)
        if redis.url_secret is not None:
            ref = redis.url_secret
            url = (await self._secret_value(namespace, ref.name, ref.key)).strip()
        if redis.ca_bundle is not None:
            ca_pem = await self._file_value(namespace, redis.ca_bundle)
        return cleanup.RedisTarget(
            url=url or redis.url,
            key_prefix=redis.key_prefix,
            password=password,
            cluster=redis.cluster,
            ca_pem=ca_pem,
        )

    async def _secret_value(self, namespace: str, name: str, key: str) -> str:
        secret = await self.kube.get("v1", "Secret", namespace, name)
        data = (secret or {}).get("data") or {}
        if key not in data:
            raise ValueError(f"Secret {name} has no key {key}")
        return base64.b64decode(data[key]).decode()

    async def _file_value(self, namespace: str, ref: DataKeyRef) -> str:
        if ref.secret is not None:
            return await self._secret_value(namespace, ref.secret, ref.key)
        config_map = await self.kube.get("v1", "ConfigMap", namespace, str(ref.config_map))
        data = (config_map or {}).get("data") or {}
        if ref.key not in data:
            raise ValueError(f"ConfigMap {ref.config_map} has no key {ref.key}")
        return str(data[ref.key])

    # -- policies ------------------------------------------------------------------------------

    async def _policies_selecting(self, namespace: str, pool: JsonDict) -> list[JsonDict]:
        found = []
        for policy in await self.kube.list(GROUP_VERSION, POLICY_KIND, namespace):
            try:
                spec = RoutingPolicySpec.model_validate(policy.get("spec") or {})
            except ValidationError:
                continue
            if selects(spec, pool):
                found.append(policy)
        return found

    async def reconcile_policies_of_pool(self, namespace: str, pool_name: str) -> None:
        """Reconcile every policy of the namespace: a pool's labels, spec or readiness changed,
        and a policy may have selected it before the change or select it after."""
        try:
            policies = await self.kube.list(GROUP_VERSION, POLICY_KIND, namespace)
        except KubeError as exc:
            log.warning("cannot list RoutingPolicies in %s: %s", namespace, exc.message)
            return
        for policy in policies:
            await self.reconcile_policy(policy)

    async def reconcile_policy(self, body: JsonDict, *, reread: bool = False) -> JsonDict | None:
        """Render the router config from the selected pools, apply the router's children.
        `reread`: as for `reconcile_pool`."""
        owner = Owner.from_body(body)
        if _meta(body).get("deletionTimestamp"):
            return None
        async with self._lock(owner.kind, owner.namespace, owner.name):
            current = await self._current(owner) if reread else body
            if current is None:
                return None
            return await self._reconcile_policy(current, Owner.from_body(current))

    async def _current(self, owner: Owner) -> JsonDict | None:
        """`owner` as the API server has it now; None once it is being deleted, or replaced by
        an object of the same name (its own handler reconciles that one). Applying a list
        taken earlier undid newer changes (a scale from 4 back to 2), and after a delete and
        re-create gave the new pool's children the old owner, whose deletion then took them."""
        body = await self._get(GROUP_VERSION, owner.kind, owner.namespace, owner.name)
        if body is None or _meta(body).get("deletionTimestamp"):
            return None
        return body if str(_meta(body).get("uid", "")) == owner.uid else None

    def forget_others(self, present: set[tuple[str, str, str]]) -> None:
        """Drop what is kept per resource for those missing from `present` (kind, namespace,
        name) in two resyncs in a row: a policy has no delete handler, and each kept its last
        problem for good. One absence is no proof: a resource made after the resync's list
        may be reconciling, and a lock dropped between its holder and its next waiter would
        let two reconciles of it run at once."""
        known = set(self._locks) | set(self._problems) | set(self._advised)
        gone = {key for key in known if key not in present}
        for key in gone & self._absent:
            self._problems.pop(key, None)
            self._advised.pop(key, None)
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]
        self._absent = gone - self._absent

    async def _selected_pools(
        self, owner: Owner, spec: RoutingPolicySpec
    ) -> tuple[list[SelectedPool], int, Problem | None]:
        pools: list[SelectedPool] = []
        endpoints = 0
        problems: list[str] = []
        items = await self.kube.list(GROUP_VERSION, POOL_KIND, owner.namespace)
        present = {_meta(p).get("name") for p in items if not _meta(p).get("deletionTimestamp")}
        for name in spec.pools:
            if name not in present:
                problems.append(f"InferencePool {name} not found in namespace {owner.namespace}")
        for item in sorted(items, key=lambda p: str(_meta(p).get("name"))):
            if _meta(item).get("deletionTimestamp") or not selects(spec, item):
                continue
            name = str(_meta(item)["name"])
            try:
                pool_spec = InferencePoolSpec.model_validate(item.get("spec") or {})
            except ValidationError as exc:
                problems.append(f"InferencePool {name} is invalid: {describe(exc)}")
                continue
            pools.append(SelectedPool(name=name, namespace=owner.namespace, spec=pool_spec))
            endpoints += int((item.get("status") or {}).get("readyReplicas") or 0)
        taken = {pool.name for pool in pools}
        for pool in await self._gateway_pools(owner, spec, problems) if spec.pool_refs else []:
            if pool.name in taken:  # the router names pools by namespace/name
                problems.append(
                    f"poolRefs {pool.name}: a kvgate InferencePool this policy serves has the "
                    "same name; rename one of them"
                )
            else:
                pools.append(pool)
        if not pools:
            problems.append(
                "no valid InferencePool matches spec.pools, spec.poolRefs or spec.poolSelector"
            )
        reason = "NoPools" if not pools else "PoolsMissing"
        return pools, endpoints, Problem(reason, "; ".join(problems)) if problems else None

    async def _gateway_pools(
        self, owner: Owner, spec: RoutingPolicySpec, problems: list[str]
    ) -> list[SelectedPool]:
        """The Gateway API InferencePools of `spec.poolRefs`; what is missing goes to `problems`."""
        what = f"InferencePool ({GATEWAY_POOL_API_VERSION})"
        try:
            items = await self.kube.list(
                GATEWAY_POOL_API_VERSION, GATEWAY_POOL_KIND, owner.namespace
            )
        except KubeError as exc:
            problems.append(f"cannot list {what}s: {exc.message}")
            return []
        by_name = {
            str(_meta(p).get("name")): p for p in items if not _meta(p).get("deletionTimestamp")
        }
        pools = []
        for ref in spec.pool_refs:
            body = by_name.get(ref.name)
            if body is None:
                problems.append(f"{what} {ref.name} not found in namespace {owner.namespace}")
                continue
            try:
                pools.append(gateway_pool(owner.name, owner.namespace, ref, body))
            except ValueError as exc:
                problems.append(f"{what} {ref.name} cannot be routed to: {exc}")
        return pools

    async def _indexer_replicas(self, owner: Owner, spec: RoutingPolicySpec) -> int | None:
        """1 when the policy needs `kvgate indexer`; 0 to park one it no longer needs."""
        if needs_indexer(spec):
            return 1
        existing = await self._own_deployment(owner, indexer_name(owner.name))
        return 0 if existing is not None else None

    async def _own_deployment(self, owner: Owner, name: str) -> JsonDict | None:
        """The Deployment `name` if `owner` controls it (another resource's of that name, a
        `NameTaken`, is none of its own: its pods are not this resource's)."""
        deployment = await self._get("apps/v1", "Deployment", owner.namespace, name)
        ref = _controller(deployment) if deployment is not None else None
        if ref is None or (ref.get("kind"), ref.get("name")) != (owner.kind, owner.name):
            return None
        return deployment

    async def _reconcile_policy(self, body: JsonDict, owner: Owner) -> JsonDict:
        problem: Problem | None = None
        pools: list[SelectedPool] = []
        endpoints = 0
        config_hash = str((body.get("status") or {}).get("configHash") or "")
        deployment: JsonDict | None = None
        desired = 0
        try:
            spec = RoutingPolicySpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            spec, problem = None, Problem("InvalidSpec", describe(exc))
        if spec is not None:
            desired = spec.router.replicas
            await self._advise(body, owner, unshared_replicas(spec))
            try:
                pools, endpoints, problem = await self._selected_pools(owner, spec)
            except KubeError as exc:
                problem = Problem("ApplyFailed", f"cannot list InferencePools: {exc.message}")
        if spec is not None and pools:
            missing = await missing_references(self.kube, owner.namespace, spec, pools)
            problem = combined(problem, missing)
            indexer_replicas = await self._indexer_replicas(owner, spec)
            try:
                children, config_hash = policy_children(
                    owner, spec, pools, self.settings.router_image, indexer_replicas
                )
            except ValueError as exc:
                problem = Problem("InvalidConfig", f"router config is invalid: {exc}")
            else:
                applied, apply_problem = await self._apply_all(children)
                problem = apply_problem or problem
                # the router's (the indexer's Deployment is applied after it)
                deployment = applied.get(("Deployment", router_name(owner.name)))
        if deployment is None:
            deployment = await self._own_deployment(owner, router_name(owner.name))
        await self._report(body, owner, problem)
        status = policy_status(
            rollout=Rollout.from_deployment(deployment, desired),
            problem=problem,
            generation=owner.generation,
            pools=[p.name for p in pools],
            endpoints=endpoints,
            config_hash=config_hash,
            previous=body.get("status") or {},
            now=self._clock(),
        )
        await self._write_status(body, owner, status)
        return status

    # -- children ------------------------------------------------------------------------------

    async def reconcile_owner_of(self, child: JsonDict) -> None:
        """A child changed or vanished: reconcile the pool or policy that owns it."""
        namespace = str(_meta(child).get("namespace") or "default")
        ref = _controller(child)
        if ref is not None and ref.get("apiVersion") == GROUP_VERSION:
            owner = await self._get(GROUP_VERSION, ref["kind"], namespace, ref["name"])
            if owner is None or _meta(owner).get("uid") != ref.get("uid"):
                return
            owner.setdefault("apiVersion", GROUP_VERSION)
            owner.setdefault("kind", ref["kind"])
            if ref["kind"] == POOL_KIND:
                await self.reconcile_pool(owner)
            elif ref["kind"] == POLICY_KIND:
                await self.reconcile_policy(owner)


def unshared_replicas(spec: RoutingPolicySpec) -> str | None:
    """Why several router replicas would not see each other's load, if they would not.

    Each replica still routes by its own directory (every replica hears every pod's KV events),
    but counts only the requests it sent itself, so a burst spread over the replicas can send
    them all to the same idle pod (docs/router.md, *Router replicas*)."""
    if spec.router.replicas < 2:
        return None
    if spec.load_sharing.active(shared_directory=spec.directory.backend == "redis"):
        return None
    why = (
        "loadSharing.enabled is false"
        if spec.load_sharing.enabled is False
        else "the directory is in memory (load is shared through the Redis directory)"
    )
    return (
        f"router.replicas is {spec.router.replicas} but {why}: each replica sees only the "
        "requests it sent itself"
    )


def owner_kind(child: dict[str, Any]) -> str | None:
    """Kind of the kvgate resource controlling `child`, if any (cheap pre-filter for watches)."""
    ref = _controller(child)
    return (
        str(ref.get("kind")) if ref is not None and ref.get("apiVersion") == GROUP_VERSION else None
    )


def _controller(obj: JsonDict) -> JsonDict | None:
    """The ownerReference of `obj` that controls it, if any."""
    refs = _meta(obj).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)
