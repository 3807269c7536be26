"""The `kvgate` command.

Each subcommand lives in the package that owns it, in a module exposing
``add_arguments(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.
Modules are imported only when their subcommand runs, so `kvgate hash` never imports the router.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "kvgate.bench.demo_command",
        "run a simulated fleet and compare round robin with kvgate",
    ),
    "bench": (
        "kvgate.bench.bench_command",
        "benchmark routers side by side on a simulated fleet (`kvgate bench run ...`)",
    ),
    "crds": ("kvgate.api.crds_command", "write the generated CRD YAML (crds/*.yaml, docs)"),
    "operator": ("kvgate.operator.command", "run the kopf operator for pools and policies"),
    "hash": ("kvgate.prefix.hash_command", "print vLLM's block hashes of a list of token ids"),
    "prefix": ("kvgate.prefix.diff_command", "prefix tools: `diff` two request bodies"),
    "events": ("kvgate.directory.events_command", "decode raw vLLM KV event payloads"),
    "router": (
        "kvgate.router.command",
        "run the cache-aware router (--config or --endpoint)",
    ),
    "indexer": (
        "kvgate.indexer.command",
        "subscribe to pods' KV events and write them to the shared (Redis) directory",
    ),
    "sim": ("kvgate.sim.serve_command", "simulated vLLM pods: `sim serve` (one) or `sim fleet`"),
    "podrunner": (
        "kvgate.podrunner.command",
        "run the pods of KWOK's fake nodes as local processes (test cluster only)",
    ),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    known, rest = top.parse_known_args(argv)
    if known.command is None:
        top.print_help()
        return 2
    logging.basicConfig(
        level=known.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    module_name, help_text = COMMANDS[known.command]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"kvgate {known.command}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
