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
