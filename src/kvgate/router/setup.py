"""Factories: the quick-start config, and the keyer of a pool.

- quick start: `kvgate router --endpoint URL ... --model NAME` (and the discrete-event bench,
  which must route exactly as that command does) build their config with `quickstart_config`.
- keyer: exact with the pool's tokenizer, approximate without one (`core/keys.py`).

The policy is built by `kvgate.scoring.registry.build_policy`.
"""

from __future__ import annotations

from typing import Any

from kvgate.api.router_config import PoolConfig, RouterConfig
from kvgate.router.core.keys import Keyer
from kvgate.router.core.tokenize import load_request_tokenizer


def build_keyer(pool: PoolConfig) -> Keyer:
    return Keyer(pool.engine, load_request_tokenizer(pool.engine.tokenizer))


def quickstart_config(
    endpoints: list[str],
    model: str,
    *,
    policy: str | None = None,
    policy_params: dict[str, Any] | None = None,
    seed: int | None = None,
    block_size: int = 16,
    tokenizer: str | None = None,
    kv_events: dict[str, str] | None = None,
    endpoint_ids: dict[str, str] | None = None,
    redis: str | None = None,
    host: str = "0.0.0.0",
    port: int = 8000,
    shutdown_grace_seconds: float | None = None,
) -> RouterConfig:
    """One online pool `default/default` of static endpoints (base URLs). `kv_events` maps an
    endpoint URL to its ZMQ PUB socket; `endpoint_ids` to its directory id. Raises ValueError."""
    events = {url.rstrip("/"): zmq for url, zmq in (kv_events or {}).items()}
    ids = {url.rstrip("/"): i for url, i in (endpoint_ids or {}).items()}
    unknown = (set(events) | set(ids)) - {e.rstrip("/") for e in endpoints}
    if unknown:
        raise ValueError(f"endpoints named but not given: {sorted(unknown)}")
    server: dict[str, Any] = {"host": host, "port": port}
    if shutdown_grace_seconds is not None:
        server["shutdown_grace_seconds"] = shutdown_grace_seconds
    data: dict[str, Any] = {
        "server": server,
        "pools": [
            {
                "name": "default",
                "model": model,
                "engine": {"block_size": block_size, "tokenizer": {"path": tokenizer}},
                "endpoints": {
                    "static": [
                        {
                            "url": url,
                            "kv_events": events.get(url.rstrip("/")),
                            "id": ids.get(url.rstrip("/")),
                        }
                        for url in endpoints
                    ]
                },
            }
        ],
    }
    if policy or policy_params or seed is not None:
        data["policy"] = {"name": policy or "kvgate", "params": policy_params or {}, "seed": seed}
    if redis:
        data["directory"] = {"backend": "redis", "redis": {"url": redis}}
    return RouterConfig.model_validate(data)
