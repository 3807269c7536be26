"""The few Kubernetes API calls the operator makes, behind a small protocol.

`Kube` is what the reconcilers use; `ApiKube` implements it with kubernetes_asyncio's
`ApiClient` (generic REST paths, so one code path serves every kind), and tests use an in-memory
fake. Children are written with **server-side apply** (`fieldManager=kvgate-operator`,
`force=true`): applying the same object twice is a no-op that bumps nothing, and applying it
after someone edited or deleted a child puts the operator's fields back — drift correction is
just "apply again". Every API failure surfaces as :class:`KubeError` carrying the API server's
own message.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from kvgate.api.base import GROUP_VERSION, JsonDict
from kvgate.operator.render.common import FIELD_MANAGER

log = logging.getLogger(__name__)
EVENT_SOURCE = "kvgate-operator"

PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Event"): "events",
    ("v1", "Pod"): "pods",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("apps/v1", "Deployment"): "deployments",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    (GROUP_VERSION, "InferencePool"): "inferencepools",
    (GROUP_VERSION, "RoutingPolicy"): "routingpolicies",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
}


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Kube(Protocol):
    async def apply(self, obj: JsonDict) -> JsonDict:
        """Server-side apply `obj` (create or update the fields the operator owns)."""
        ...

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> JsonDict | None:
        """The object, or None when it does not exist."""
        ...

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
    ) -> list[JsonDict]:
        """Objects of a kind in a namespace, or in all (None); apiVersion and kind set."""
        ...

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JsonDict
    ) -> None:
        """Merge-patch the status subresource; a vanished object is not an error."""
        ...


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None
) -> str:
    """The REST path of an object, of a namespace's collection, or (namespace None) of all."""
    try:
        plural = PLURALS[(api_version, kind)]
    except KeyError:
        raise KubeError(0, f"kvgate does not know the resource for {api_version} {kind}") from None
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is None:
        return f"{base}/{plural}"
    # Quoted whole: a name taken from a resource's spec never reaches another path.
    path = f"{base}/namespaces/{quote(namespace, safe='')}/{plural}"
    return f"{path}/{quote(name, safe='')}" if name else path


def _message(exc: Exception) -> tuple[int, str]:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    if body:
        try:
            return status, str(json.loads(body).get("message") or body)
        except (ValueError, AttributeError):
            return status, str(body)
    return status, str(exc) or type(exc).__name__


class ApiKube:
    """`Kube` over a kubernetes_asyncio `ApiClient` (owned by the caller)."""

    def __init__(self, api_client: Any, request_timeout_seconds: float = 30.0) -> None:
        self._client = api_client
        self._timeout = request_timeout_seconds

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        try:
            return await self._client.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )
        except Exception as exc:  # ApiException, aiohttp errors, timeouts: all readable
            raise KubeError(*_message(exc)) from exc

    async def apply(self, obj: JsonDict) -> JsonDict:
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        result = await self._call(
            "PATCH",
            path,
            body=obj,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )
        return dict(result or {})

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> JsonDict | None:
        try:
            found = await self._call("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found)

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
    ) -> list[JsonDict]:
        query = [("labelSelector", label_selector)] if label_selector else []
        found = await self._call("GET", resource_path(api_version, kind, namespace), query=query)
        items = list((found or {}).get("items") or [])
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: JsonDict
    ) -> None:
        path = resource_path(api_version, kind, namespace, name) + "/status"
        try:
            await self._call(
                "PATCH",
                path,
                body={"status": status},
                content_type="application/merge-patch+json",
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def create_event(
        self, involved: JsonDict, *, type: str, reason: str, message: str
    ) -> None:
        """Create a core/v1 Event about `involved` (a full object or its metadata)."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'kvgate')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call("POST", resource_path("v1", "Event", namespace), body=event)


class KubeEvents:
    """`EventSink` that writes Events through the API; a failure is logged, never raised.

    The operator posts its own events instead of using kopf's event queue, so that they work
    the same from handlers, from the resync task and from child watches.
    """

    def __init__(self, kube: ApiKube) -> None:
        self._kube = kube

    async def __call__(self, body: JsonDict, *, type: str, reason: str, message: str) -> None:
        try:
            await self._kube.create_event(body, type=type, reason=reason, message=message)
        except KubeError as exc:
            log.warning("cannot post event %s %s: %s", reason, message, exc.message)
