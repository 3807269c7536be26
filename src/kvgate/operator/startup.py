"""Operator startup and shutdown: kopf settings, the API client, the reconciler in `memo`.

Settings come from `memo.operator_settings` when `kvgate operator` starts kopf, else from the
environment (`kopf run -m kvgate.operator`): `KVGATE_ROUTER_IMAGE`,
`KVGATE_OPERATOR_RESYNC_SECONDS`, `KVGATE_OPERATOR_CLEANUP_TIMEOUT_SECONDS`,
`KVGATE_OPERATOR_NAMESPACES` (comma-separated; what the resync lists). The startup handler owns
the resync task; the cleanup handler cancels and awaits it. kopf keeps its
bookkeeping in `kvgate.io/*` annotations (never in `status`, whose schema is strict), and only
warnings are posted as Kubernetes events on kopf's behalf; kvgate posts its own through the API
(`KubeEvents`), from handlers and from the resync task alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from kvgate.operator.kube import ApiKube, KubeEvents
from kvgate.operator.reconcile import OperatorSettings, Reconciler
from kvgate.operator.resync import resync_forever
from kvgate.tasks import cancel_and_wait

WATCH_SECONDS = 60

log = logging.getLogger(__name__)


def settings_from_env() -> OperatorSettings:
    defaults = OperatorSettings()
    namespaces = os.environ.get("KVGATE_OPERATOR_NAMESPACES", "")
    return OperatorSettings(
        namespaces=tuple(n for n in namespaces.split(",") if n),
        router_image=os.environ.get("KVGATE_ROUTER_IMAGE", defaults.router_image),
        resync_seconds=float(
            os.environ.get("KVGATE_OPERATOR_RESYNC_SECONDS", defaults.resync_seconds)
        ),
        cleanup_timeout_seconds=float(
            os.environ.get(
                "KVGATE_OPERATOR_CLEANUP_TIMEOUT_SECONDS", defaults.cleanup_timeout_seconds
            )
        ),
    )


async def _api_client() -> Any:
    from kubernetes_asyncio import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config()
    return client.ApiClient()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvgate.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvgate.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "kvgate.io/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # A watch on an API server that went silent without closing the connection (its node
    # died, a partition) would wait forever: the server ends each watch, the client bounds it.
    settings.watching.server_timeout = WATCH_SECONDS
    settings.watching.client_timeout = WATCH_SECONDS + 15
    settings.watching.connect_timeout = 10
    operator_settings = getattr(memo, "operator_settings", None) or settings_from_env()
    memo.api_client = await _api_client()
    kube = ApiKube(memo.api_client)
    memo.reconciler = Reconciler(kube, KubeEvents(kube), operator_settings)
    memo.resync_task = asyncio.create_task(
        resync_forever(memo.reconciler), name="kvgate-operator-resync"
    )
    log.info("kvgate operator started: %s", operator_settings)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    await cancel_and_wait(getattr(memo, "resync_task", None))
    api_client = getattr(memo, "api_client", None)
    if api_client is not None:
        await api_client.close()
