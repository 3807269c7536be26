"""kopf handlers for InferencePool: thin wrappers around :class:`Reconciler`."""

from __future__ import annotations

from typing import Any

import kopf

from kvgate.operator.handlers_common import HANDLER_BACKOFF_SECONDS, POOL, plain, reconciler


@kopf.on.resume(*POOL, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.create(*POOL, backoff=HANDLER_BACKOFF_SECONDS)
@kopf.on.update(*POOL, backoff=HANDLER_BACKOFF_SECONDS)
async def pool_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await reconciler(memo).reconcile_pool(plain(body))


@kopf.on.delete(*POOL, backoff=HANDLER_BACKOFF_SECONDS)
async def pool_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: drop the pool from its policies' router configs (a pool being deleted is never
    selected), so routers stop indexing it, then clear its directory entries (bounded)."""
    rec = reconciler(memo)
    data = plain(body)
    meta = data["metadata"]
    await rec.reconcile_policies_of_pool(meta.get("namespace") or "default", meta["name"])
    await rec.finalize_pool(data)
