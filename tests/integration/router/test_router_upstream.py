"""The router's lean HTTP/1.1 client against a real socket server that misbehaves on purpose."""

from __future__ import annotations

import asyncio

import pytest
from tests.integration.conftest import free_port

from kvgate.router.http.upstream import (
    MAX_RESPONSE_HEAD_BYTES,
    RawUpstream,
    UpstreamError,
    read_all,
)


class Server:
    """Answers each request per `mode`; counts connections and notices disconnects."""

    def __init__(self) -> None:
        self.mode = "length"
        self.connections = 0
        self.closed = asyncio.Event()
        self.port = free_port()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if self.mode == "length":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello")
                elif self.mode == "chunked":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
                    )
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.write(b"2\r\nde\r\n0\r\n\r\n")
                elif self.mode == "close-delimited":
                    writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil-eof")
                    await writer.drain()
                    writer.close()
                    return
                elif self.mode == "close-after":  # answer, then drop the idle connection
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    await writer.drain()
                    writer.close()
                    return
                elif self.mode == "big-head":  # 32 KiB of headers: within the limit
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n")
                    writer.write(b"x-a: " + b"a" * (32 << 10) + b"\r\n\r\nok")
                elif self.mode == "endless-head":  # headers that never end
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                    while not writer.is_closing():
                        writer.write(b"x: y\r\n" * 1000)
                        await writer.drain()
                elif self.mode == "silent":
                    await asyncio.sleep(10)
                elif self.mode == "slow-body":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart")
                    await writer.drain()
                    if not await reader.read(1):
                        self.closed.set()
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@pytest.fixture
async def server():
    srv = Server()
    handle = await asyncio.start_server(srv.handle, "127.0.0.1", srv.port)
    yield srv
    handle.close()
    await handle.wait_closed()


async def _get(up: RawUpstream, port: int, head_seconds: float = 2.0):
    return await up.request(
        "POST", f"http://127.0.0.1:{port}/x", b"{}", [(b"content-type", b"application/json")],
        connect_timeout=1.0, head_timeout=head_seconds,
    )  # fmt: skip


async def test_keep_alive_connections_are_reused(server):
    up = RawUpstream()
    up.know(f"http://127.0.0.1:{server.port}/")
    for _ in range(5):
        resp = await _get(up, server.port)
        assert resp.status == 200 and (b"x-a", b"1") in resp.headers
        assert await read_all(resp) == b"hello"
    assert server.connections == 1
    await up.aclose()


async def test_chunked_and_close_delimited_bodies(server):
    up = RawUpstream()
    server.mode = "chunked"
    resp = await _get(up, server.port)
    assert [c async for c in resp.chunks()] == [b"abc", b"de"]
    await resp.aclose()
    server.mode = "close-delimited"
    assert await read_all(await _get(up, server.port)) == b"until-eof"
    await up.aclose()


async def test_an_idle_connection_closed_by_the_pod_is_replaced(server):
    up = RawUpstream()
    server.mode = "close-after"
    for _ in range(3):
        assert await read_all(await _get(up, server.port)) == b"ok"
        await asyncio.sleep(0.05)  # the server's FIN arrives while the connection is idle
    assert server.connections == 3
    await up.aclose()


async def test_timeouts_refusals_and_abandoned_bodies(server):
    up = RawUpstream()
    server.mode = "silent"
    with pytest.raises(UpstreamError) as exc:
        await _get(up, server.port, head_seconds=0.2)
    assert exc.value.kind == "timeout"
    with pytest.raises(UpstreamError) as exc:
        await _get(up, free_port())
    assert exc.value.kind == "connect"
    server.mode = "slow-body"
    resp = await _get(up, server.port)
    assert await anext(resp.chunks()) == b"part"
    await resp.aclose()  # abandoned mid-body: the connection is closed, the pod notices
    await asyncio.wait_for(server.closed.wait(), 2)
    await up.aclose()


async def test_forgetting_a_pod_closes_its_idle_connections(server):
    up = RawUpstream()
    assert await read_all(await _get(up, server.port)) == b"hello"
    up.forget(f"http://127.0.0.1:{server.port}")
    await asyncio.wait_for(server.closed.wait(), 2)
    await up.aclose()


async def test_a_response_head_is_bounded(server):
    up = RawUpstream()
    server.mode = "big-head"
    assert await read_all(await _get(up, server.port)) == b"ok"
    server.mode = "endless-head"
    with pytest.raises(UpstreamError) as exc:
        await _get(up, server.port, head_seconds=5.0)
    assert exc.value.kind == "stream" and str(MAX_RESPONSE_HEAD_BYTES) in str(exc.value)
    await asyncio.wait_for(server.closed.wait(), 2)  # the connection was dropped
    await up.aclose()
