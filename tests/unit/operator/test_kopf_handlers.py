"""The kopf handlers are thin: each hands a plain copy of the body to the reconciler in memo."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from fake_kube import Events, FakeKube

from kvgate.api.base import GROUP_VERSION
from kvgate.operator import children, policies, pools
from kvgate.operator.handlers_common import plain, reconciler
from kvgate.operator.reconcile import OperatorSettings, Reconciler


def memo_for(kube: FakeKube, events: Events, resync: float = 30.0) -> kopf.Memo:
    settings = OperatorSettings(router_image="kvgate:test", resync_seconds=resync)
    return kopf.Memo(reconciler=Reconciler(kube, events, settings))


def pool_body() -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"model": "m", "gpus": 0},
    }


async def test_pool_and_policy_handlers_reconcile(kube: FakeKube, events: Events) -> None:
    memo = memo_for(kube, events)
    body = kube.put(pool_body())
    await pools.pool_changed(body=body, memo=memo)  # type: ignore[arg-type]
    assert kube.find("Deployment", "p") is not None
    policy = kube.put(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "RoutingPolicy",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"pools": ["p"]},
        }
    )
    await policies.policy_changed(body=policy, memo=memo)  # type: ignore[arg-type]
    assert kube.find("ConfigMap", "r-router-config") is not None


async def test_child_events_reach_the_owner(kube: FakeKube, events: Events) -> None:
    memo = memo_for(kube, events)
    body = kube.put(pool_body())
    await pools.pool_changed(body=body, memo=memo)  # type: ignore[arg-type]
    service = kube.find("Service", "p")
    assert service is not None
    del kube.objects[("v1", "Service", "default", "p")]
    event = {"type": "DELETED", "object": service}
    await children.child_event(event=event, body=service, memo=memo)  # type: ignore[arg-type]
    assert kube.find("Service", "p") is not None


async def test_initial_listing_and_foreign_children_are_ignored(
    kube: FakeKube, events: Events
) -> None:
    memo = memo_for(kube, events)
    child = {"metadata": {"name": "x", "namespace": "default", "ownerReferences": []}}
    await children.child_event(event={"type": None}, body=child, memo=memo)  # type: ignore[arg-type]
    await children.child_event(event={"type": "MODIFIED"}, body=child, memo=memo)  # type: ignore[arg-type]
    assert kube.applied == []


async def test_delete_handler_finalizes_and_updates_policies(
    kube: FakeKube, events: Events
) -> None:
    memo = memo_for(kube, events)
    body = pool_body()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await pools.pool_deleted(body=kube.put(body), memo=memo)  # type: ignore[arg-type]
    assert events.posted == []  # no policy used a Redis directory: nothing to clear


def test_memo_without_reconciler_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="startup handler"):
        reconciler(kopf.Memo())


def test_plain_detaches_mappings() -> None:
    from types import MappingProxyType

    body = MappingProxyType({"a": MappingProxyType({"b": [1, MappingProxyType({"c": 2})]})})
    assert plain(body) == {"a": {"b": [1, {"c": 2}]}}
