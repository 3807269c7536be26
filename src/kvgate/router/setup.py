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
from kvgate.directory.factory import create_index
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.router.fallback import FallbackIndex
from kvgate.router.keys import Keyer
from kvgate.router.metrics import RouterMetrics
from kvgate.router.tokenize import load_request_tokenizer
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
    return Keyer(pool.engine, load_request_tokenizer(pool.engine.tokenizer))


def build_index(
    directory: DirectoryConfig,
    pool: PoolConfig,
    metrics: RouterMetrics,
    directory_metrics: DirectoryMetrics | None = None,
) -> BlockIndex:
    if directory.backend == "memory":
        return create_index(directory, pool.key, metrics=directory_metrics)
    password = directory.redis.password.read() if directory.redis.password else None
    shared = create_index(directory, pool.key, metrics=directory_metrics, redis_password=password)
    return FallbackIndex(
        shared,
        create_index(directory.model_copy(update={"backend": "memory"}), pool.key),
        metrics,
        resync_interval=directory.redis.resync_interval_seconds,
    )
