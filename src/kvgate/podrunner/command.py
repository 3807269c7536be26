"""``kvgate podrunner``: run the pods of KWOK's fake nodes as local processes.

Started by hack/cluster/up.sh inside the cluster's network namespace, where every pod IP and
every ClusterIP is a local address. Two tasks: the pod runner (runner.py) and the service
proxy with its hosts file (services.py). SIGTERM or SIGINT stops every pod process, then both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
from pathlib import Path

from kubernetes_asyncio import client, config

from kvgate.podrunner.runner import PodRunner, RunnerConfig
from kvgate.podrunner.services import ServiceProxy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", required=True, help="kubeconfig of the cluster")
    parser.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="directory for the pods' volumes, credentials and container logs",
    )
    parser.add_argument(
        "--host-ip",
        required=True,
        help="the cluster namespace's own address: the pods' gateway (10.245.0.1 in up.sh)",
    )
    parser.add_argument(
        "--pod-api-server",
        default=None,
        help="API server URL for the pods' kubeconfigs (default: the one of --kubeconfig)",
    )
    parser.add_argument(
        "--hosts-file",
        type=Path,
        default=None,
        help="hosts file to keep Service names in (the namespace's /etc/netns/<ns>/hosts)",
    )
    parser.add_argument(
        "--no-service-proxy",
        action="store_true",
        help="do not listen on Service ClusterIPs",
    )
    parser.add_argument(
        "--kvgate",
        default=shutil.which("kvgate") or "kvgate",
        help="the kvgate command run for vLLM (`kvgate sim serve`) and kvgate images",
    )


def _read_ca(path: str | None, state_dir: Path) -> bytes:
    state_dir.mkdir(parents=True, exist_ok=True)
    return Path(path).read_bytes() if path else b""


async def _serve(args: argparse.Namespace) -> int:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    ca_cert = _read_ca(configuration.ssl_ca_cert, args.state_dir)
    runner_config = RunnerConfig(
        state_dir=args.state_dir.resolve(),
        kvgate=args.kvgate,
        api_server=args.pod_api_server or str(configuration.host),
        ca_cert=ca_cert,
        host_ip=args.host_ip,
    )
    async with client.ApiClient(configuration) as api:
        tasks = [asyncio.create_task(PodRunner(api, runner_config).run(), name="podrunner")]
        if not args.no_service_proxy:
            proxy = ServiceProxy(api, args.hosts_file)
            tasks.append(asyncio.create_task(proxy.run(), name="service-proxy"))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: [t.cancel() for t in tasks])
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    print("podrunner: stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))
