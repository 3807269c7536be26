"""Factories from config to the parts other packages own: policy, keyer, directory index.

- policy: `kvgate.scoring`'s registry builds it by name from `policy.params`; the top-level
  `policy.max_affinity_wait_seconds` is passed in when the policy takes that parameter (and the
  params do not set it themselves).
- keyer: exact with the pool's tokenizer, approximate without one (`keys.py`).
- index: one `BlockIndex` per pool; memory, or Redis under `<prefix>` with the pool's hash tag,
  wrapped so that a Redis failure falls back to a local view (`fallback.py`).
"""

from __future__ import annotations

from typing import Any

from kvgate.api.router_config import DirectoryConfig, PoolConfig, RouterConfig
from kvgate.directory.base import BlockIndex
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.router.keys import Keyer
from kvgate.router.metrics import RouterMetrics
from kvgate.router.tokenize import load_tokenizers
from kvgate.scoring.base import Policy
from kvgate.scoring.registry import RegistryError, default_registry


def build_policy(config: RouterConfig) -> Policy:
    registry = default_registry()
    name = config.policy.name
    try:
        model = registry.params_model("policy", name)
        params: dict[str, Any] = dict(config.policy.params)
        if "max_affinity_wait_seconds" in model.model_fields:
            params.setdefault("max_affinity_wait_seconds", config.policy.max_affinity_wait_seconds)
        return registry.policy(name, params)
    except (RegistryError, ValueError) as exc:
        raise ValueError(f"policy: {exc}") from exc


def build_keyer(pool: PoolConfig) -> Keyer:
    chat, text = load_tokenizers(pool.engine.tokenizer)
    return Keyer(pool.engine, chat_tokenizer=chat, text_tokenizer=text)


def build_index(directory: DirectoryConfig, pool: PoolConfig, metrics: RouterMetrics) -> BlockIndex:
    if directory.backend == "memory":
        return MemoryBlockIndex()
    from kvgate.router.fallback import build_redis_index

    return build_redis_index(directory, pool, metrics)
