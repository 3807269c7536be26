"""Factories from config to the parts other packages own: the policy and the keyer.

- policy: `kvgate.scoring`'s registry builds it by name from `policy.params`; the top-level
  `policy.max_affinity_wait_seconds` is passed in when the policy takes that parameter (and the
  params do not set it themselves).
- keyer: exact with the pool's tokenizer, approximate without one (`keys.py`).
"""

from __future__ import annotations

from typing import Any

from kvgate.api.router_config import PoolConfig, RouterConfig
from kvgate.router.core.keys import Keyer
from kvgate.router.core.tokenize import load_request_tokenizer
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
