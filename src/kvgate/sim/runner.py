"""Run simulated pods under uvicorn (uvloop + httptools), one or many in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import uvicorn

from kvgate.sim.config import ServerConfig
from kvgate.sim.pod import SimPod
from kvgate.sim.server import SimApp
from kvgate.sim.text import TextCodec, load_codec
from kvgate.tasks import cancel_and_wait


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner (several share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


def uvicorn_server(app: SimApp, host: str, port: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        backlog=4096,
    )
    return _QuietServer(config)


async def serve_pods(configs: list[ServerConfig]) -> None:
    """Serve every pod until SIGINT/SIGTERM, then shut all of them down."""
    import zmq.asyncio

    context = zmq.asyncio.Context()
    codecs: dict[tuple[str | None, str], TextCodec] = {}  # a fleet loads each tokenizer once
    servers = []
    try:
        for cfg in configs:
            key = (cfg.tokenizer, cfg.model)
            if key not in codecs:
                codecs[key] = load_codec(cfg.tokenizer, cfg.model, cfg.engine.vocab_size)
            pod = SimPod(cfg, context, codec=codecs[key])
            servers.append(uvicorn_server(SimApp(pod), cfg.host, cfg.port))
    except BaseException:
        context.destroy(linger=0)  # close the sockets of the pods built so far
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [
        asyncio.create_task(s.serve(), name=f"sim-http-{c.port}")
        for s, c in zip(servers, configs, strict=True)
    ]
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _pending = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await cancel_and_wait(stopper)
        context.term()


def run_event_loop(configs: list[ServerConfig]) -> None:
    try:
        import uvloop

        uvloop.run(serve_pods(configs))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve_pods(configs))


def serve_pod(config: ServerConfig) -> None:
    run_event_loop([config])
