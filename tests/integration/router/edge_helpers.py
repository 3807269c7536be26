"""A real `kvgate router` process for edge tests, a pod (a real HTTP server) that answers with
canned bytes, and a raw HTTP/1.1 client that can send what no well-behaved library would (huge
or endless headers, wrong lengths, broken chunking)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.integration.conftest import free_port

_START_TIMEOUT_SECONDS = 30.0


class RouterProcess:
    """`kvgate router --config` in a subprocess on a free loopback port, logging to a file."""

    def __init__(
        self,
        tmp_path: Path,
        config: dict[str, Any],
        *,
        open_files: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.port = free_port()
        config = {**config, "server": {**config.get("server", {}), "host": "127.0.0.1",
                                       "port": self.port}}  # fmt: skip
        self.config_path = tmp_path / f"router-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp_path / f"router-{self.port}.log"
        self._log = self.log_path.open("wb")

        def limit_open_files() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvgate.cli", "router", "--config", str(self.config_path),
             *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_open_files,  # only sets an rlimit
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"router exited: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"router not ready: {self.log_path.read_text()}")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def error_lines(self) -> list[str]:
        """Lines a router operator would be paged for: ERROR logs and tracebacks."""
        return [
            line
            for line in self.log_text().splitlines()
            if "ERROR" in line or "Traceback" in line or "Exception in ASGI" in line
        ]

    def metric(self, name: str, labels: str = "") -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        prefix = f"{name}{{{labels}}}" if labels else name
        total = 0.0
        for line in text.splitlines():
            if line.startswith(prefix + " ") or (not labels and line.startswith(name + "{")):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


def router_config(pod_urls: list[str], **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pools": [
            {"name": "p", "model": "m", "endpoints": {"static": [{"url": u} for u in pod_urls]}}
        ],
        "policy": {"seed": 7},
    }
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def completion_answer(model: str = "m", text: str = "hi", completion_tokens: int = 1) -> bytes:
    """A pod's whole `/v1/completions` answer."""
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens},
        }
    ).encode()


PodAnswer = Callable[[dict[str, Any]], tuple[bytes, str]]
"""What a canned pod answers a POST with: (body, content type) for the request's JSON body."""


def canned_pod(
    answer: PodAnswer, metrics: Callable[[], bytes] = lambda: b""
) -> type[BaseHTTPRequestHandler]:
    """A pod's HTTP handler: a POST gets `answer(body)`, `GET /metrics` the page `metrics()`
    returns, any other GET an empty page; keep-alive, as vLLM serves."""

    class Pod(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._send(metrics() if self.path == "/metrics" else b"", "text/plain")

        def do_POST(self) -> None:
            self._send(*answer(json.loads(self.rfile.read(int(self.headers["content-length"])))))

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # the router stopped reading (a bound)
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Pod


@contextlib.contextmanager
def router_before_pod(
    pod: type[BaseHTTPRequestHandler],
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], None] = lambda config: None,
    **overrides: Any,
) -> Iterator[tuple[RouterProcess, str]]:
    """A real router (`router_config(..., **overrides)`, then `edit`ed) in front of one pod
    served by `pod` on a free port; yields the router and the pod's endpoint id."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), pod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint_id = f"127.0.0.1:{server.server_port}"
    config = router_config([f"http://{endpoint_id}"], **overrides)
    edit(config)
    try:
        with running_router(tmp_path, config) as proc:
            yield proc, endpoint_id
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def running_router(tmp_path: Path, config: dict[str, Any]) -> Iterator[RouterProcess]:
    """A real router with `config`, ready; stopped on the way out."""
    proc = RouterProcess(tmp_path, config)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@dataclass
class RawResponse:
    status: int | None  # None: the connection closed without an answer
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnection:
    """One TCP connection; `send` bytes, `response()` reads one HTTP/1.1 response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        return cls(reader, writer)

    async def send(self, data: bytes) -> bool:
        """False if the peer already closed or reset the connection."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    async def response(self, within_seconds: float = 10.0, *, head: bool = False) -> RawResponse:
        """The next final response (interim 1xx answers are skipped); `head`: the request was
        a HEAD, so the response has no body whatever its content-length says."""
        async with asyncio.timeout(within_seconds):
            while True:
                response = await self._one_response(head)
                if response.status is None or response.status >= 200:
                    return response

    async def _one_response(self, head: bool) -> RawResponse:
        try:
            line = await self.reader.readline()
        except (ConnectionError, OSError):
            return RawResponse(None)
        if not line:
            return RawResponse(None)
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if head or status < 200 or status in (204, 304):
            pass
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = await _read_chunked(self.reader)
        return RawResponse(status, headers, body)

    async def closed_by_peer(self, within_seconds: float) -> bool:
        """True once the peer closes (EOF or reset) within `within_seconds`."""
        try:
            async with asyncio.timeout(within_seconds):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except (ConnectionError, OSError):
            return True
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "host: router"]
    merged = {"content-type": "application/json", "content-length": str(len(body))}
    merged.update(headers or {})
    head += [f"{k}: {v}" for k, v in merged.items() if v is not None]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def timed(coro: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - started


Check = Callable[[RawResponse], bool]
