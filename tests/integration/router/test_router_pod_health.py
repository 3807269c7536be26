"""A real `kvgate router` process before two real HTTP pods: a pod that starts every streamed
answer and then breaks it leaves rotation for `eject_seconds` after `eject_after_failures` broken
streams, as one failing before its first byte does; clients that hang up mid-stream do not get a
good pod ejected. The pods answer /metrics, as a real engine whose answers break still does."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from tests.integration.router.edge_helpers import RouterProcess, router_config, running_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EJECT_AFTER_FAILURES = 3
EJECT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 0.5

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"connection: close\r\n\r\n"
)
EVENT = b'data: {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hi"}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Pod:
    """Streams every POST's answer as `mode` says: `complete` (`events` events, one per
    `gap_seconds`, then `[DONE]`), or one event and part of the next, then `reset` (a TCP reset)
    or `stall` (silence until the router hangs up). GET (/metrics) gets an empty 200."""

    def __init__(self, mode: str, *, events: int = 2, gap_seconds: float = 0.0) -> None:
        self.mode = mode
        self.events = events
        self.gap_seconds = gap_seconds
        self.posts = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if not head.startswith(b"POST"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            else:
                self.posts += 1
                await self._stream(reader, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the router hung up (its client left, or it gave up on a stalled stream)
        finally:
            writer.close()

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + _chunk(EVENT))
        if self.mode == "complete":
            for _ in range(self.events - 1):
                await writer.drain()
                await asyncio.sleep(self.gap_seconds)
                writer.write(_chunk(EVENT))
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return
        writer.write(_chunk(EVENT[:20]))  # an event the pod never finishes
        await writer.drain()
        if self.mode == "stall":
            await reader.read(1)  # until the router closes the connection
            return
        await asyncio.sleep(0.1)  # the router has read the bytes: the reset comes after them
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


@contextlib.asynccontextmanager
async def _serving(*pods: Pod) -> AsyncIterator[None]:
    servers = [await asyncio.start_server(pod.handle, "127.0.0.1", 0) for pod in pods]
    for pod, server in zip(pods, servers, strict=True):
        pod.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield
    finally:
        for server in servers:
            server.close()


@contextlib.contextmanager
def _router(tmp_path: Path, *pods: Pod) -> Iterator[RouterProcess]:
    """Round-robin: while both pods are in rotation, requests alternate between them."""
    config = router_config(
        [pod.url for pod in pods],
        policy={"name": "round-robin"},
        limits={
            "read_timeout_seconds": READ_TIMEOUT_SECONDS,
            "eject_after_failures": EJECT_AFTER_FAILURES,
            "eject_seconds": EJECT_SECONDS,
        },
    )
    with running_router(tmp_path, config) as proc:
        yield proc


async def _stream(client: httpx.AsyncClient) -> tuple[str, bytes]:
    """The pod the router chose (host:port) and the stream its client got."""
    body = {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as got:
        assert got.status_code == 200
        return got.headers["x-kvgate-endpoint"], await got.aread()


def _endpoints(router: RouterProcess) -> dict[str, float]:
    """`kvgate_router_endpoints` by state (one pool)."""
    text = httpx.get(router.url + "/metrics", timeout=5).text
    return {
        line.split('state="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvgate_router_endpoints{")
    }


def _pod_id(pod: Pod) -> str:
    return pod.url.removeprefix("http://")


@pytest.mark.parametrize("breaks_by", ["reset", "stall"])
async def test_a_pod_that_breaks_every_stream_is_ejected_for_a_while(
    tmp_path: Path, breaks_by: str
) -> None:
    bad, good = Pod(breaks_by), Pod("complete")
    async with _serving(bad, good), httpx.AsyncClient(timeout=30) as client:
        with _router(tmp_path, bad, good) as router:
            client.base_url = httpx.URL(router.url)
            await asyncio.sleep(0.3)  # a few /metrics scrapes: both pods answer them
            for _ in range(4 * EJECT_AFTER_FAILURES):
                endpoint, text = await _stream(client)
                if endpoint == _pod_id(bad):
                    assert b'"type": "upstream_error"' in text and b"[DONE]" not in text, text
                if bad.posts == EJECT_AFTER_FAILURES:
                    break
            assert bad.posts == EJECT_AFTER_FAILURES
            ejected_at = time.monotonic()
            # The dashboards' count of endpoints by state sees it (it read ready for good).
            assert _endpoints(router) == {"ready": 1.0, "ejected": 1.0}
            # Out of rotation: every request goes to the good pod, /metrics scrapes or not.
            while time.monotonic() - ejected_at < EJECT_SECONDS - 1.0:
                endpoint, text = await _stream(client)
                assert endpoint == _pod_id(good) and text.endswith(b"data: [DONE]\n\n"), text
                await asyncio.sleep(0.05)
            assert bad.posts == EJECT_AFTER_FAILURES
            # Then back, as a pod ejected for failures before the first byte is.
            await asyncio.sleep(max(0.0, ejected_at + EJECT_SECONDS + 0.2 - time.monotonic()))
            chosen = {(await _stream(client))[0] for _ in range(2)}
            assert chosen == {_pod_id(bad), _pod_id(good)}
            assert _endpoints(router) == {"ready": 2.0, "ejected": 0.0}
            errors = router.metric("kvgate_router_upstream_errors_total")
            assert errors == EJECT_AFTER_FAILURES + 1
            assert not router.error_lines(), router.error_lines()


async def test_clients_that_hang_up_mid_stream_do_not_get_a_good_pod_ejected(
    tmp_path: Path,
) -> None:
    slow = [Pod("complete", events=50, gap_seconds=0.05) for _ in range(2)]
    async with _serving(*slow), httpx.AsyncClient(timeout=30) as client:
        with _router(tmp_path, *slow) as router:
            client.base_url = httpx.URL(router.url)
            body = {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True}
            for _ in range(2 * (EJECT_AFTER_FAILURES + 1)):  # each pod's clients hang up
                async with client.stream("POST", "/v1/completions", json=body) as got:
                    assert got.status_code == 200
                    async for chunk in got.aiter_bytes():
                        assert chunk.startswith(b"data: ")
                        break  # hang up after the first event
            assert [pod.posts for pod in slow] == [EJECT_AFTER_FAILURES + 1] * 2
            for pod in slow:
                pod.events = 1
            chosen = {(await _stream(client))[0] for _ in range(2)}
            assert chosen == {_pod_id(pod) for pod in slow}, "a pod left rotation"
            assert router.metric("kvgate_router_upstream_errors_total") == 0
            assert not router.error_lines(), router.error_lines()
