"""kopf handlers for RoutingPolicy: thin wrappers around :class:`Reconciler`.

A policy has no finalizer (no delete handler, no daemon): its children are garbage-collected
through owner references, and the periodic resync is one operator-level task (`resync`).
"""

from __future__ import annotations

from typing import Any

import kopf

from kvgate.operator.handlers_common import HANDLER_BACKOFF_SECONDS, POLICY, plain, reconciler


@kopf.on.resume(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.create(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.update(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
async def policy_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await reconciler(memo).reconcile_policy(plain(body))
