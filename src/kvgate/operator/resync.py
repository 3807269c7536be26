"""The periodic resync: every pool, then every policy, reconciled again.

Watches on the children catch most drift at once; the resync catches the rest (a missed event,
an API error that has since gone away, a status that depends on another object) and refreshes
status. It is one operator-level task, owned by the startup handler and cancelled and awaited by
the cleanup handler, rather than a kopf daemon per object: kopf guards every object that has a
daemon with a finalizer, and a RoutingPolicy needs none (it would make `kubectl delete` hang
whenever the operator is not running).
"""

from __future__ import annotations

import asyncio
import logging

from kvgate.api.base import GROUP_VERSION
from kvgate.api.policy import POLICY_KIND
from kvgate.api.pool import POOL_KIND
from kvgate.operator.kube import KubeError
from kvgate.operator.reconcile import Reconciler

log = logging.getLogger(__name__)


async def resync_all(reconciler: Reconciler) -> int:
    """Reconcile every pool and policy in the watched namespaces; returns how many."""
    scopes: list[str | None] = list(reconciler.settings.namespaces) or [None]
    done = 0
    present: set[tuple[str, str, str]] = set()
    listed = True
    for kind in (POOL_KIND, POLICY_KIND):
        for scope in scopes:
            try:
                items = await reconciler.kube.list(GROUP_VERSION, kind, scope)
            except KubeError as exc:
                log.warning("resync: cannot list %s in %s: %s", kind, scope or "*", exc.message)
                listed = False
                continue
            for item in items:
                meta = item.get("metadata") or {}
                present.add((kind, str(meta.get("namespace") or "default"), str(meta.get("name"))))
                try:  # read again in turn: the list is old by the time an item's turn comes
                    if kind == POOL_KIND:
                        await reconciler.reconcile_pool(item, cascade=False, reread=True)
                    else:
                        await reconciler.reconcile_policy(item, reread=True)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one broken object must not stop the others
                    name = (item.get("metadata") or {}).get("name")
                    log.exception("resync of %s %s failed", kind, name)
                done += 1
    if listed:
        reconciler.forget_others(present)
    return done


async def resync_forever(reconciler: Reconciler) -> None:
    """`resync_all` every `resync_seconds`, until cancelled."""
    while True:
        await asyncio.sleep(reconciler.settings.resync_seconds)
        await resync_all(reconciler)
