"""`kvgate router`: run the router.

    kvgate router --config router.yaml
    kvgate router --endpoint http://127.0.0.1:8001 --endpoint http://127.0.0.1:8002 \\
        --model meta-llama/Llama-3.1-8B-Instruct [--policy kvgate] [--port 8000] \\
        [--tokenizer DIR] [--kv-events http://127.0.0.1:8001=tcp://127.0.0.1:5557 ...]

With `--config` the file is watched and reloaded on change (except `server`: the listener and
the connection limits are set at start). `--shutdown-grace` overrides
`server.shutdown_grace_seconds`: how long SIGTERM waits for requests in flight. The quick start builds a one-pool
config: every `--endpoint` is a static endpoint; `--kv-events URL=ZMQ` names an endpoint's KV
event socket (endpoints without one are tracked approximately, from routing history).
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from kvgate.api.router_config import RouterConfig, ServerConfig, load_router_config
from kvgate.router.setup import quickstart_config

if TYPE_CHECKING:
    from kvgate.router.metrics import RouterMetrics
    from kvgate.router.server.app import RouterApp
    from kvgate.serving import EdgeState

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="router config file (YAML); reloaded on change")
    parser.add_argument(
        "--endpoint", action="append", default=[], help="engine base URL (repeatable)"
    )
    parser.add_argument("--model", help="model name the endpoints serve (quick start)")
    parser.add_argument("--policy", default=None, help="routing policy (default kvgate)")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the policy's tie-breaking (reproducible runs)",
    )
    parser.add_argument("--host", default=None, help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default 8000)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (exact keys)")
    parser.add_argument("--block-size", type=int, default=16, help="engines' --block-size")
    parser.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="URL=tcp://HOST:PORT",
        help="an endpoint's KV event socket (repeatable)",
    )
    parser.add_argument("--redis", default=None, help="Redis URL for a shared directory")
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM, let requests in flight run this long, then end them (default 30)",
    )


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The config named by `--config`, or the quick-start config built from the flags."""
    if args.config:
        if args.endpoint or args.model:
            raise ValueError("give either --config or --endpoint/--model, not both")
        config = load_router_config(args.config)
        overrides = {
            k: v
            for k, v in (
                ("host", args.host),
                ("port", args.port),
                ("shutdown_grace_seconds", args.shutdown_grace),
            )
            if v is not None
        }
        if not overrides:
            return config
        merged = ServerConfig.model_validate({**config.server.model_dump(), **overrides})
        return config.model_copy(update={"server": merged})
    if not args.endpoint or not args.model:
        raise ValueError("give --config FILE, or at least one --endpoint and --model")
    events: dict[str, str] = {}
    for item in args.kv_events:
        url, sep, zmq = item.partition("=")
        if not sep or not zmq:
            raise ValueError(f"--kv-events wants URL=tcp://HOST:PORT, got {item!r}")
        events[url] = zmq
    return quickstart_config(
        args.endpoint,
        args.model,
        policy=args.policy,
        seed=args.seed,
        block_size=args.block_size,
        tokenizer=args.tokenizer,
        kv_events=events,
        redis=args.redis,
        host=args.host if args.host is not None else "0.0.0.0",
        port=args.port if args.port is not None else 8000,
        shutdown_grace_seconds=args.shutdown_grace,
    )


def run(args: argparse.Namespace) -> int:
    import prometheus_client

    from kvgate.router.runtime import RouterRuntime
    from kvgate.router.server.app import RouterApp
    from kvgate.serving import listen, raise_open_files_limit, serve

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # one series per counter, as dashboards expect
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
    try:
        config = config_from_args(args)
        runtime = RouterRuntime(config, config_path=args.config)
    except (ValueError, OSError) as exc:
        print(f"kvgate router: {exc}")
        return 2
    server = config.server
    try:
        sock = listen(server.host, server.port)
    except OSError as exc:
        print(f"kvgate router: cannot listen on {server.host}:{server.port}: {exc}")
        return 2
    raise_open_files_limit()
    app = RouterApp(runtime)
    edge = edge_state(server, runtime.metrics)
    print(
        f"kvgate router: {len(config.pools)} pool(s), policy {config.policy.name}, "
        f"listening on http://{server.host}:{server.port} "
        f"(at most {edge.limits.max_connections} connections)",
        flush=True,
    )
    serve(
        with_cors(app, server.cors_allowed_origins),
        sock,
        edge=edge,
        grace_seconds=server.shutdown_grace_seconds,
        on_grace_expired=app.drain.expire,
        lifespan="on",
        access_log=False,  # the router logs requests itself (server.access_log)
        log_level="warning",
        proxy_headers=False,  # the router is the edge; no X-Forwarded-* rewriting per request
        server_header=False,
    )
    return 0


def with_cors(app: RouterApp, origins: list[str]) -> Any:
    """`app`, answering CORS for `origins` if any (Starlette's middleware: preflights, and the
    headers on every answer, streams included), as vLLM's server does for its --allowed-origins."""
    if not origins:
        return app
    from starlette.middleware.cors import CORSMiddleware

    from kvgate.router.http.proxy import DECISION_HEADERS

    return CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["x-request-id", *DECISION_HEADERS],
    )


def edge_state(server: ServerConfig, metrics: RouterMetrics) -> EdgeState:
    """The connection limits of `server` (the cap kept under the open-files limit), reporting
    into the router's metrics."""
    from kvgate.serving import EdgeLimits, EdgeState, connection_budget

    cap = connection_budget(server.max_connections, server.reserved_file_descriptors)
    if cap < server.max_connections:
        log.warning(
            "server.max_connections %d lowered to %d to stay under the open-files limit",
            server.max_connections,
            cap,
        )
    limits = EdgeLimits(
        max_header_bytes=server.max_header_bytes,
        header_timeout_seconds=server.header_timeout_seconds,
        body_timeout_seconds=server.body_timeout_seconds,
        idle_timeout_seconds=server.idle_timeout_seconds,
        write_stall_timeout_seconds=server.write_stall_timeout_seconds,
        max_connections=cap,
    )
    closed = metrics.connections_closed
    edge = EdgeState(limits, on_close=lambda reason: closed.labels(reason).inc())
    metrics.open_connections.set_function(lambda: edge.open_connections)
    return edge
