"""kopf handlers for RoutingPolicy: thin wrappers around :class:`Reconciler`.

A policy has no finalizer: its children are garbage-collected through owner references.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from kvgate.operator.handlers_common import HANDLER_BACKOFF_SECONDS, POLICY, plain, reconciler

log = logging.getLogger(__name__)


@kopf.on.resume(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.create(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.update(*POLICY, backoff=HANDLER_BACKOFF_SECONDS)
async def policy_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await reconciler(memo).reconcile_policy(plain(body))


@kopf.daemon(*POLICY, cancellation_timeout=2.0)
async def policy_resync(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """Re-render the router config and re-apply children periodically."""
    rec = reconciler(memo)
    while not stopped:
        await stopped.wait(rec.settings.resync_seconds)
        if stopped:
            break
        try:
            await rec.reconcile_policy(plain(body))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("resync of RoutingPolicy %s failed", body.get("metadata", {}).get("name"))
