"""The router config the discrete-event bench runs: the one ``kvgate router --endpoint ...
--model ... --policy NAME`` builds (``quickstart_config``), with one endpoint per simulated pod
and its KV events on an in-process address, adjusted only where simulated time needs it."""

from __future__ import annotations

from typing import Any

from kvgate.api.fleet import WarmupConfig
from kvgate.api.router_config import RouterConfig
from kvgate.router.setup import quickstart_config
from kvgate.sim.des import DESFleet

MODEL = "sim-model"


def pod_url(pod_id: str) -> str:
    """The URL a simulated pod's endpoint has (never dialled: the bench calls no HTTP)."""
    return f"http://{pod_id.replace(':', '-')}:8000"


def des_router_config(
    fleet: DESFleet,
    policy: str,
    *,
    seed: int,
    policy_params: dict[str, Any] | None,
    config_update: dict[str, Any] | None,
    pool_class: str,
    cpu_offload: bool,
    warmup: WarmupConfig | None,
) -> RouterConfig:
    """`config_update`: router config sections replacing the quick-start's (tenants,
    flow_control, ...), as in the router's YAML; `pool_class`: the one pool's class; with
    ``fleet.cache_ops`` the pool's engines accept AKV cache ops; `cpu_offload`: the pool's
    `engine.cpu_offload`; `warmup`: the router's warm-up settings (its `shared` is left unset:
    whether replicas share warm-ups is the bench's to say, the config's memory directory
    cannot)."""
    ids = list(fleet.names)  # the endpoints' directory ids
    urls = [pod_url(pod_id) for pod_id in ids]
    config = quickstart_config(
        urls,
        MODEL,
        policy=policy,
        policy_params=policy_params,
        seed=seed,
        block_size=fleet.block_size,
        kv_events={url: f"inproc://{pod_id}" for url, pod_id in zip(urls, ids, strict=True)},
        endpoint_ids=dict(zip(urls, ids, strict=True)),
    )
    # Simulated time has no event loop to keep responsive: every prompt is keyed inline.
    update: dict[str, Any] = {
        "keying": config.keying.model_copy(update={"inline_max_chars": 1 << 62})
    }
    if warmup is not None:
        update["warmup"] = warmup.model_copy(update={"shared": None})
    config = config.model_copy(update=update)
    data = config.model_dump()
    data["pools"][0]["pool_class"] = pool_class
    config = type(config).model_validate({**data, **(config_update or {})})
    engine_flags: dict[str, bool] = {}
    if fleet.cache_ops:
        engine_flags["cache_ops"] = True
    if cpu_offload:
        engine_flags["cpu_offload"] = True
    if not engine_flags:
        return config
    first = config.pools[0]
    engine = first.engine.model_copy(update=engine_flags)
    return config.model_copy(update={"pools": [first.model_copy(update={"engine": engine})]})
