"""The operator-level resync: every pool and policy, in the watched namespaces, until cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_kube import Events, FakeKube

from kvgate.api.base import GROUP_VERSION
from kvgate.operator.kube import KubeError
from kvgate.operator.reconcile import OperatorSettings, Reconciler
from kvgate.operator.resync import resync_all, resync_forever


def put_pool(kube: FakeKube, name: str, namespace: str, **spec: Any) -> None:
    kube.put(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": "m", "gpus": 0, **spec},
        }
    )


def put_policy(kube: FakeKube, name: str, namespace: str, pool: str) -> None:
    kube.put(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "RoutingPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"pools": [pool]},
        }
    )


def reconciler(kube: FakeKube, events: Events, *namespaces: str) -> Reconciler:
    settings = OperatorSettings(resync_seconds=0.01, namespaces=tuple(namespaces))
    return Reconciler(kube, events, settings)


async def test_resync_recreates_children_everywhere(kube: FakeKube, events: Events) -> None:
    put_pool(kube, "a", "ns1")
    put_pool(kube, "b", "ns2")
    put_policy(kube, "r", "ns2", "b")
    assert await resync_all(reconciler(kube, events)) == 3
    assert kube.find("Deployment", "a", "ns1") is not None
    assert kube.find("Deployment", "r-router", "ns2") is not None
    assert kube.find("InferencePool", "b", "ns2")["status"]["observedGeneration"] == 1  # type: ignore[index]


async def test_resync_stays_in_its_namespaces(kube: FakeKube, events: Events) -> None:
    put_pool(kube, "a", "ns1")
    put_pool(kube, "b", "ns2")
    assert await resync_all(reconciler(kube, events, "ns2")) == 1
    assert kube.find("Deployment", "a", "ns1") is None
    assert kube.find("Deployment", "b", "ns2") is not None


async def test_one_broken_object_does_not_stop_the_others(
    kube: FakeKube, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    put_pool(kube, "a", "ns1")
    put_pool(kube, "b", "ns1")
    rec = reconciler(kube, events)
    original = rec.reconcile_pool

    async def flaky(body: Any, **kwargs: Any) -> Any:
        if body["metadata"]["name"] == "a":
            raise RuntimeError("bug")
        return await original(body, **kwargs)

    rec.reconcile_pool = flaky  # type: ignore[method-assign]
    assert await resync_all(rec) == 2
    assert kube.find("Deployment", "b", "ns1") is not None
    assert "resync of InferencePool a failed" in caplog.text


async def test_list_errors_are_logged(
    kube: FakeKube, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    kube.fail_all = KubeError(403, "forbidden")
    assert await resync_all(reconciler(kube, events)) == 0
    assert "cannot list InferencePool in *: forbidden" in caplog.text


async def test_resync_forever_repeats_until_cancelled(kube: FakeKube, events: Events) -> None:
    put_pool(kube, "a", "ns1")
    rec = reconciler(kube, events)
    task = asyncio.create_task(resync_forever(rec))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if kube.find("Deployment", "a", "ns1") is not None:
            del kube.objects[("apps/v1", "Deployment", "ns1", "a")]
            break
    for _ in range(200):
        await asyncio.sleep(0.01)
        if kube.find("Deployment", "a", "ns1") is not None:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert kube.find("Deployment", "a", "ns1") is not None


async def test_the_resync_reads_each_object_again_in_its_turn(
    kube: FakeKube, events: Events
) -> None:
    """The resync walks a list taken at its start: applying an object as listed undid a newer
    change (a scale from 4 back to 2), and after a delete and re-create gave the new pool's
    children the old owner, whose deletion took them."""
    put_pool(kube, "a", "ns1", replicas=2)
    put_pool(kube, "b", "ns1", replicas=2)
    rec = reconciler(kube, events)
    original = rec.reconcile_pool
    changes = [True]

    async def meanwhile(body: Any, **kwargs: Any) -> Any:
        if body["metadata"]["name"] == "a" and changes.pop():  # b changes while a's turn
            changes.append(False)
            kube.find("InferencePool", "b", "ns1")["spec"]["replicas"] = 4  # type: ignore[index]
            del kube.objects[(GROUP_VERSION, "InferencePool", "ns1", "b")]
            put_pool(kube, "b", "ns1", replicas=4)  # deleted and made again: a new uid
        return await original(body, **kwargs)

    rec.reconcile_pool = meanwhile  # type: ignore[method-assign]
    await resync_all(rec)
    assert kube.find("Deployment", "b", "ns1") is None  # the old b's turn: nothing applied
    await resync_all(rec)
    deployment = kube.find("Deployment", "b", "ns1")
    new_uid = kube.find("InferencePool", "b", "ns1")["metadata"]["uid"]  # type: ignore[index]
    assert deployment["spec"]["replicas"] == 4  # type: ignore[index]
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == new_uid  # type: ignore[index]
    # the generation observed is the object's as read again, not the list's
    kube.find("InferencePool", "a", "ns1")["metadata"]["generation"] = 2  # type: ignore[index]
    listed = [kube.find("InferencePool", "a", "ns1")]
    listed = [{**listed[0], "metadata": {**listed[0]["metadata"], "generation": 1}}]  # type: ignore[index]
    await original(listed[0], cascade=False, reread=True)
    status = kube.find("InferencePool", "a", "ns1")["status"]  # type: ignore[index]
    assert status["observedGeneration"] == 2


async def test_what_is_kept_per_resource_goes_with_it(kube: FakeKube, events: Events) -> None:
    """Policies have no delete handler: their locks and last problems were kept for good.
    They go once missing from two resyncs in a row."""
    put_pool(kube, "a", "ns1")
    put_policy(kube, "r", "ns1", "missing")  # a problem to remember
    rec = reconciler(kube, events)
    await resync_all(rec)
    assert ("RoutingPolicy", "ns1", "r") in rec._problems
    del kube.objects[(GROUP_VERSION, "RoutingPolicy", "ns1", "r")]
    await resync_all(rec)  # one absence is no proof (one made after the list may be running)
    assert ("RoutingPolicy", "ns1", "r") in rec._problems
    await resync_all(rec)
    assert ("RoutingPolicy", "ns1", "r") not in rec._problems
    assert ("RoutingPolicy", "ns1", "r") not in rec._locks
