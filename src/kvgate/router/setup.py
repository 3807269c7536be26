"""Factory from config to the keyer: exact with the pool's tokenizer, approximate without one
(`keys.py`). The policy is built by `kvgate.scoring.registry.build_policy`."""

from __future__ import annotations

from kvgate.api.router_config import PoolConfig
from kvgate.router.core.keys import Keyer
from kvgate.router.core.tokenize import load_request_tokenizer


def build_keyer(pool: PoolConfig) -> Keyer:
    return Keyer(pool.engine, load_request_tokenizer(pool.engine.tokenizer))
