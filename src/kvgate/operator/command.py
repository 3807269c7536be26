"""`kvgate operator`: run the kopf operator (the same handlers as `kopf run -m kvgate.operator`).

Credentials come from `KUBECONFIG` (or ~/.kube/config), else from the in-cluster service
account. Without `--namespace`, the operator watches every namespace.
"""

from __future__ import annotations

import argparse
import os
import socket

from kvgate.operator.reconcile import OperatorSettings
from kvgate.operator.startup import settings_from_env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = settings_from_env()
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="no peering with other operator replicas (no kopf peering CRDs needed)",
    )
    parser.add_argument(
        "--router-image",
        default=defaults.router_image,
        help=f"router image when a policy sets none (default {defaults.router_image})",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=defaults.resync_seconds,
        help=f"period of the drift-correcting resync (default {defaults.resync_seconds})",
    )
    parser.add_argument(
        "--cleanup-timeout-seconds",
        type=float,
        default=defaults.cleanup_timeout_seconds,
        help="bound on clearing a deleted pool from Redis "
        f"(default {defaults.cleanup_timeout_seconds})",
    )
    parser.add_argument(
        "--liveness",
        default=None,
        help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    import kvgate.operator  # noqa: F401  (registers the handlers)

    namespaces = [] if args.all_namespaces else list(args.namespace)
    settings = OperatorSettings(
        router_image=args.router_image,
        resync_seconds=args.resync_seconds,
        cleanup_timeout_seconds=args.cleanup_timeout_seconds,
        namespaces=tuple(namespaces),
    )
    kopf.run(
        identity=operator_identity(),  # type: ignore[arg-type]
        standalone=args.standalone,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(operator_settings=settings),
    )
    return 0


def operator_identity() -> str:
    """Who this operator is to kopf: `POD_ID` (kopf's variable), else the host name (the pod's
    name in a cluster). kopf's own fallback asks `getpass.getuser()`, which raises KeyError
    for a UID the image has no passwd entry for (the chart's `runAsUser: 65532` in an image
    without that user): the operator crashed at start."""
    return os.environ.get("POD_ID") or socket.gethostname()
