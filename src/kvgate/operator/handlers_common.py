"""What every kopf handler module shares: resource ids, body conversion, the reconciler in memo.

Handler timing knobs are read once, when the handler modules are imported (kopf binds them in
its decorators): `KVGATE_OPERATOR_BACKOFF_SECONDS` (retry delay of a failed handler, default 10)
and, at startup, `KVGATE_OPERATOR_RESYNC_SECONDS` (see :mod:`kvgate.operator.startup`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from kvgate.api.base import API_GROUP, API_VERSION, JsonDict
from kvgate.api.policy import POLICY_PLURAL
from kvgate.api.pool import POOL_PLURAL
from kvgate.operator.reconcile import Reconciler

POOL = (API_GROUP, API_VERSION, POOL_PLURAL)
POLICY = (API_GROUP, API_VERSION, POLICY_PLURAL)
HANDLER_BACKOFF_SECONDS = float(os.environ.get("KVGATE_OPERATOR_BACKOFF_SECONDS", "10"))


def plain(body: Any) -> JsonDict:
    """A kopf body (mapping views) as plain, detached dicts and lists."""
    data: JsonDict = json.loads(json.dumps(body, default=dict))
    return data


def reconciler(memo: Any) -> Reconciler:
    found = getattr(memo, "reconciler", None)
    if not isinstance(found, Reconciler):
        raise RuntimeError("the startup handler did not put a Reconciler into memo")
    return found
