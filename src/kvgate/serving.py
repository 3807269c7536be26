"""Serve an ASGI app on a socket bound before the app starts.

Binding first turns "address already in use" into a clear error and a non-zero exit before any
background task starts; uvicorn binding late would log the error while the app's lifespan (KV
event subscribers, scrapers) keeps the process alive without a listener.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any


def listen(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """A listening TCP socket on ``host:port``; raises OSError with the reason when it can't."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


def serve(app: Any, sock: socket.socket, **uvicorn_options: Any) -> None:
    """Run ``app`` under uvicorn (uvloop + httptools) on the already-bound ``sock``."""
    import uvicorn

    config = uvicorn.Config(app, loop="uvloop", http="httptools", **uvicorn_options)
    # uvicorn re-raises SIGINT after a graceful shutdown; Ctrl-C is a clean exit, as in uvicorn.run.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])
