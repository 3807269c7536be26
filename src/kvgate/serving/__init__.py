"""Serve an ASGI app on a socket bound before the app starts, with bounded connections and a
graceful, bounded shutdown.

Binding first turns "address already in use" into a clear error and a non-zero exit before any
background task starts; uvicorn binding late would log the error while the app's lifespan (KV
event subscribers, scrapers) keeps the process alive without a listener.

Connections go through `edge.EdgeProtocol` (header bytes, header/body/idle deadlines, a
connection cap) when `serve` is given `EdgeLimits`. `connection_budget` keeps that cap below
the process's open-files limit.

Shutdown (SIGTERM or SIGINT): uvicorn stops accepting, closes idle connections and lets
requests in flight finish. `grace_seconds` later, `on_grace_expired` is called (the app ends
what is still open, cleanly); uvicorn's own cancellation follows 2 s after that as a backstop.
A SIGTERM-initiated drain then exits 0 (uvicorn would re-raise the signal and die by it): for
an orchestrator a drained router is a clean stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from kvgate.serving.edge import MAX_PENDING_REFUSALS, EdgeLimits, EdgeState, protocol_class

log = logging.getLogger(__name__)

# uvicorn's own cancellation of tasks still running, after `on_grace_expired` had its chance.
_BACKSTOP_SECONDS = 2.0

__all__ = [
    "EdgeLimits",
    "EdgeState",
    "connection_budget",
    "listen",
    "raise_open_files_limit",
    "serve",
]


def listen(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """A listening TCP socket on ``host:port``; raises OSError with the reason when it can't."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go and nginx do); the soft limit after.

    Distributions start processes at a soft limit of 1,024 while allowing far more; a router
    holding many client and pod connections should use what it is allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's default nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def connection_budget(max_connections: int, reserved_file_descriptors: int) -> int:
    """`max_connections`, capped so that client connections cannot exhaust file descriptors.

    Each active client connection may hold one pod connection too, so clients get half of what
    the open-files limit leaves after `reserved_file_descriptors` (Redis, ZMQ, scrapes, the
    listener, files) and the pending refusals the edge allows; at least 1."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = (int(soft) - reserved_file_descriptors - MAX_PENDING_REFUSALS) // 2
    return max(1, min(max_connections, room))


class _GracefulServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        grace_seconds: float,
        on_grace_expired: Callable[[], None] | None,
    ) -> None:
        super().__init__(config)
        self._grace_seconds = grace_seconds
        self._on_grace_expired = on_grace_expired

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = None
        if self._on_grace_expired is not None:
            log.info("draining: %.1f s for requests in flight", self._grace_seconds)
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self._grace_seconds, self._on_grace_expired)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                # uvicorn re-raises captured signals when this context exits; drop SIGTERM.
                self._captured_signals[:] = [
                    s for s in self._captured_signals if s != signal.SIGTERM
                ]


def serve(
    app: Any,
    sock: socket.socket,
    *,
    edge: EdgeState | None = None,
    grace_seconds: float = 10.0,
    on_grace_expired: Callable[[], None] | None = None,
    **uvicorn_options: Any,
) -> None:
    """Run ``app`` under uvicorn (uvloop + httptools) on the already-bound ``sock``.

    `edge`: per-connection limits (else uvicorn's unbounded defaults). `grace_seconds`: how
    long a shutdown waits for requests in flight before `on_grace_expired` is called."""
    http: Any = protocol_class(edge) if edge is not None else "httptools"
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http=http,
        ws="none",
        timeout_graceful_shutdown=math.ceil(grace_seconds + _BACKSTOP_SECONDS),
        **uvicorn_options,
    )
    server = _GracefulServer(config, grace_seconds, on_grace_expired)
    # uvicorn re-raises SIGINT after a graceful shutdown; Ctrl-C is a clean exit, as in uvicorn.run.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
