"""AKV cache ops the router adds for clients that send none (`cacheOps` in the config).

Tool-response rolling drop: keep every reasoning message and the last N tool responses (chat
messages with role `tool`); when a newer tool response arrives, drop the KV of the oldest one
kept, at the newer one's boundary (`kvgate.prefix.cache_ops.rolling_drop`). The ops are a pure
function of the history, so a session's next turn resends exactly the ops of this one plus its
own, and its keys extend this turn's. Only toward pools whose engines accept ops
(`engine.cache_ops`); a request that carries its own `cache` is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.api.router_config import CacheOpsConfig, PoolConfig
from kvgate.prefix.cache_ops import rolling_drop


def added_cache_ops(
    body: Mapping[str, Any], kind: str, pool: PoolConfig, config: CacheOpsConfig
) -> dict[str, Any] | None:
    """The `cache` field the router adds to `body` for `pool`, or None."""
    if not (config.rolling_drop and pool.engine.cache_ops and kind == "chat"):
        return None
    if body.get("cache") is not None:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    tools = [
        i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "tool"
    ]
    ops = rolling_drop(tools, config.keep_tool_responses)
    return ops.to_json() if ops is not None else None
