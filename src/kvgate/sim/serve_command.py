"""`kvgate sim serve|fleet`: one simulated vLLM pod, or many in one process.

``kvgate sim serve`` takes the ``vllm serve`` flags the kvgate operator renders (an unknown flag
is an error) plus ``--sim-*`` flags; ``kvgate sim fleet --pods N --base-port P`` runs N pods.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvgate.sim.config import add_vllm_arguments, config_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="one simulated vLLM pod (accepts `vllm serve` flags)")
    add_vllm_arguments(serve)
    fleet = sub.add_parser("fleet", help="N simulated pods in one process")
    from kvgate.sim.fleet import add_fleet_arguments

    add_fleet_arguments(fleet)
    add_vllm_arguments(fleet, single_pod=False)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "serve":
            from kvgate.sim.runner import serve_pod

            config = config_from_args(args)
            print(
                f"simulated vLLM pod {config.served_model_name} on "
                f"http://{config.host}:{config.port}",
                file=sys.stderr,
            )
            serve_pod(config)
            return 0
        from kvgate.sim.fleet import describe, fleet_configs
        from kvgate.sim.runner import run_event_loop

        configs = fleet_configs(args)
        for line in describe(configs):  # one JSON line per pod, for scripts
            print(json.dumps(line), flush=True)
        run_event_loop(configs)
        return 0
    except ValueError as exc:
        print(f"kvgate sim: error: {exc}", file=sys.stderr)
        return 2
