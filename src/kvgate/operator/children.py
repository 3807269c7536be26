"""Watches on the objects the operator creates: a changed or deleted child is reconciled back.

Only objects labelled `app.kubernetes.io/managed-by: kvgate` are watched, and only those whose
controller is a kvgate resource trigger anything. Because children are written with
server-side apply, reconciling after one of our own (no-op) applies changes nothing and causes
no further events; a Deployment's status changes reach the owner's status within one event.
"""

from __future__ import annotations

from typing import Any

import kopf

from kvgate.operator.handlers_common import plain, reconciler
from kvgate.operator.reconcile import owner_kind
from kvgate.operator.render.common import MANAGED_BY, MANAGED_BY_LABEL

_MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}


@kopf.on.event("apps", "v1", "deployments", labels=_MANAGED)
@kopf.on.event("", "v1", "services", labels=_MANAGED)
@kopf.on.event("", "v1", "configmaps", labels=_MANAGED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_MANAGED)
async def child_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if event.get("type") is None:  # the initial listing: resume handlers cover it
        return
    child = plain(body)
    if owner_kind(child) is None:
        return
    await reconciler(memo).reconcile_owner_of(child)
