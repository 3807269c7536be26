"""`kvgate sim fleet`: N simulated pods in one process and one event loop.

Pod ``i`` listens on ``--base-port + i`` on ``--host`` (default 127.0.0.1), or, with
``--hosts IP0,IP1,...`` (one address per pod, e.g. pod IPs of a test cluster's network
namespace), on ``--base-port`` of its own address. KV events are enabled with
``--kv-events-base-port``: pod ``i`` publishes on that port (+ i when pods share an address), its
replay socket on ``--kv-replay-base-port`` likewise, with topic ``kv@<host>@<model>`` (the
operator's ``kv@$(POD_IP)@<model>``, which the router expects of a static endpoint).
Every pod gets the same engine flags; ``--sim-seed`` is offset by the pod index.
"""

from __future__ import annotations

import argparse
import copy

from kvgate.sim.config import KVEventsConfig, ServerConfig, config_from_args


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, required=True, help="number of pods")
    parser.add_argument("--base-port", type=int, default=8000, help="HTTP port of pod 0")
    parser.add_argument("--host", default="127.0.0.1", help="address of every pod")
    parser.add_argument(
        "--hosts", default=None, help="comma-separated address per pod (overrides --host)"
    )
    parser.add_argument("--kv-events-base-port", type=int, default=None)
    parser.add_argument("--kv-replay-base-port", type=int, default=None)


def fleet_configs(args: argparse.Namespace) -> list[ServerConfig]:
    if args.pods < 1:
        raise ValueError("--pods must be >= 1")
    hosts = [h.strip() for h in args.hosts.split(",")] if args.hosts else None
    if hosts is not None and len(hosts) != args.pods:
        raise ValueError(f"--hosts lists {len(hosts)} addresses for {args.pods} pods")
    base = config_from_args(args)
    configs: list[ServerConfig] = []
    for i in range(args.pods):
        cfg = copy.deepcopy(base)
        offset = 0 if hosts else i
        cfg.host = hosts[i] if hosts else args.host
        cfg.port = args.base_port + offset
        cfg.engine.seed = base.engine.seed + i
        if args.kv_events_base_port is not None:
            replay = None
            if args.kv_replay_base_port is not None:
                replay = f"tcp://{cfg.host}:{args.kv_replay_base_port + offset}"
            cfg.kv_events = KVEventsConfig(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint=f"tcp://{cfg.host}:{args.kv_events_base_port + offset}",
                replay_endpoint=replay,
                topic=f"kv@{cfg.host}@{cfg.served_model_name}",
            )
            cfg.kv_events_bind = True
        configs.append(cfg)
    return configs


def describe(configs: list[ServerConfig]) -> list[dict[str, str | None]]:
    return [
        {
            "url": f"http://{c.host}:{c.port}",
            "kv_events": c.kv_events.endpoint if c.kv_events.enabled else None,
            "kv_replay": c.kv_events.replay_endpoint if c.kv_events.enabled else None,
            "topic": c.kv_events.topic if c.kv_events.enabled else None,
        }
        for c in configs
    ]
