"""A watch on Gateway API Inference Extension InferencePools (`inference.networking.k8s.io/v1`).

kvgate does not own these: it only reads them, so the handler is a plain event watch (kopf keeps
no state on the object, it never patches it). Any change re-reconciles the namespace's policies,
which pick up a changed selector or port in the headless Service they render for the pool. On a
cluster without that CRD kopf watches nothing here.
"""

from __future__ import annotations

from typing import Any

import kopf

from kvgate.api.policy import GATEWAY_INFERENCE_GROUP, GATEWAY_INFERENCE_VERSION
from kvgate.operator.handlers_common import reconciler


@kopf.on.event(GATEWAY_INFERENCE_GROUP, GATEWAY_INFERENCE_VERSION, "inferencepools")
async def gateway_pool_event(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    if event.get("type") is None:  # the initial listing: the policies' resume handlers cover it
        return
    meta = body.get("metadata") or {}
    await reconciler(memo).reconcile_policies_of_pool(
        str(meta.get("namespace") or "default"), str(meta.get("name"))
    )
