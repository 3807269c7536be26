"""`RawUpstream`, the router's HTTP/1.1 client to the pods, through its connection seam: each
"connection" is an in-memory reader fed with a pod's scripted bytes and a writer that records
what the router sent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from kvgate.router.http.upstream import RawUpstream, UpstreamError, read_all

URL = "http://pod:8000/v1/completions?x=1"
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class _Writer:
    def __init__(self, reader: asyncio.StreamReader, answers: list[list[bytes]]) -> None:
        self.sent = bytearray()
        self.closed = False
        self._reader = reader
        self._answers = answers

    def write(self, data: bytes) -> None:
        self.sent += data
        if self._answers:
            for chunk in self._answers.pop(0):
                if chunk == b"<EOF>":
                    self._reader.feed_eof()
                else:
                    self._reader.feed_data(chunk)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Pod:
    """Each connection answers each request it is sent with the next answer of its script (a
    list of byte chunks; `<EOF>` closes the connection); `None` never answers."""

    def __init__(self, *scripts: list[list[bytes]] | None) -> None:
        self.scripts = list(scripts)
        self.connections: list[tuple[asyncio.StreamReader, _Writer]] = []

    async def open(self, host: str, port: int) -> tuple[asyncio.StreamReader, _Writer]:
        assert (host, port) == ("pod", 8000)
        if not self.scripts:
            raise ConnectionRefusedError("no more connections")
        answers = self.scripts.pop(0)
        reader = asyncio.StreamReader()
        writer = _Writer(reader, list(answers) if answers is not None else [])
        self.connections.append((reader, writer))
        return reader, writer


def _client(pod: _Pod, **kwargs: int) -> RawUpstream:
    client = RawUpstream(open_connection=pod.open, **kwargs)  # type: ignore[arg-type]
    client.know(URL)  # the pod joined
    return client


async def _post(client: RawUpstream, head_timeout: float = 1.0) -> tuple[int, bytes]:
    response = await client.request(
        "POST",
        URL,
        b'{"a":1}',
        [(b"content-type", b"application/json")],
        connect_timeout=1.0,
        head_timeout=head_timeout,
    )
    return response.status, await read_all(response)


async def test_the_request_bytes_and_a_reused_keep_alive_connection():
    pod = _Pod([[OK], [OK]])
    client = _client(pod)
    assert await _post(client) == (200, b"{}")
    assert await _post(client) == (200, b"{}")
    assert len(pod.connections) == 1  # the second request reused the first connection
    sent = bytes(pod.connections[0][1].sent)
    first = sent[: len(sent) // 2]
    assert first.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\nhost: pod:8000\r\n")
    assert b"content-type: application/json\r\n" in first
    assert first.endswith(b"content-length: 7\r\n\r\n" + b'{"a":1}')


async def test_a_chunked_stream_arrives_piece_by_piece():
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    pod = _Pod([[head]])
    client = _client(pod)
    response = await client.request("POST", URL, b"", [], connect_timeout=1, head_timeout=1)
    reader = pod.connections[0][0]
    chunks = response.chunks()
    reader.feed_data(b"6\r\ndata: \r\n")
    assert await anext(chunks) == b"data: "
    reader.feed_data(b"4\r\nhi\n\n\r\n0\r\n\r\n")
    assert await anext(chunks) == b"hi\n\n"
    with pytest.raises(StopAsyncIteration):
        await anext(chunks)
    await response.aclose()
    assert not pod.connections[0][1].closed  # complete and keep-alive: back to the pool


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
    ],
)
async def test_a_connection_the_pod_will_close_is_not_reused(head: bytes):
    pod = _Pod([[head]], [[OK]])
    client = _client(pod)
    assert await _post(client) == (200, b"{}")
    assert pod.connections[0][1].closed
    assert await _post(client) == (200, b"{}")
    assert len(pod.connections) == 2


async def test_a_body_delimited_by_the_connections_end():
    pod = _Pod([[b"HTTP/1.1 200 OK\r\n\r\nall of it", b"<EOF>"]])
    client = _client(pod)
    assert await _post(client) == (200, b"all of it")
    assert pod.connections[0][1].closed


async def test_an_idle_connection_the_pod_closed_is_retried_once_on_a_fresh_one():
    # The pod closes an idle connection just as the router reuses it: EOF before any byte of
    # the answer. The router never knew, and the pod never saw the request: one fresh retry.
    pod = _Pod([[OK], [b"<EOF>"]], [[OK]])
    client = _client(pod)
    assert await _post(client) == (200, b"{}")
    assert await _post(client) == (200, b"{}")
    assert len(pod.connections) == 2


async def test_a_fresh_connection_closed_before_any_byte_is_an_error_not_a_retry():
    pod = _Pod([[b"<EOF>"]], [[OK]])
    with pytest.raises(UpstreamError) as err:
        await _post(_client(pod))
    assert err.value.kind == "stream"
    assert len(pod.connections) == 1


@pytest.mark.parametrize(
    ("script", "kind", "detail"),
    [
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", b"<EOF>"], "stream", "mid-body"),
        ([b"HTTP/1.1 200 OK\r\ncontent-le", b"<EOF>"], "stream", "response head"),
        ([b"NOT HTTP AT ALL\r\n\r\n"], "stream", "bad response"),
    ],
)
async def test_broken_answers_are_stream_errors(script: list[bytes], kind: str, detail: str):
    pod = _Pod([script])
    with pytest.raises(UpstreamError) as err:
        await _post(_client(pod))
    assert err.value.kind == kind and detail in str(err.value)
    assert pod.connections[0][1].closed


async def test_no_response_head_in_time_is_a_timeout():
    pod = _Pod(None)
    with pytest.raises(UpstreamError) as err:
        await _post(_client(pod), head_timeout=0.05)
    assert err.value.kind == "timeout"
    assert pod.connections[0][1].closed  # the pod learns the request was abandoned


@pytest.mark.parametrize(
    "opener",
    [
        lambda: ConnectionRefusedError("refused"),
        lambda: None,  # never connects: the connect timeout
    ],
)
async def test_connect_failures(opener: Callable[[], Exception | None]):
    async def open_connection(host: str, port: int) -> tuple[asyncio.StreamReader, _Writer]:
        failure = opener()
        if failure is not None:
            raise failure
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    client = RawUpstream(open_connection=open_connection)  # type: ignore[arg-type]
    with pytest.raises(UpstreamError) as err:
        await client.request("GET", URL, b"", [], connect_timeout=0.05, head_timeout=1)
    assert err.value.kind == "connect"


async def test_cancellation_mid_body_closes_the_connection():
    pod = _Pod([[b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart"]])
    client = _client(pod)
    response = await client.request("POST", URL, b"", [], connect_timeout=1, head_timeout=1)

    async def read() -> bytes:
        return await read_all(response)

    task = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pod.connections[0][1].closed


async def test_bytes_after_a_response_are_not_taken_for_the_next_one():
    pod = _Pod([[OK + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale"]], [[OK]])
    client = _client(pod)
    assert await _post(client) == (200, b"{}")
    assert pod.connections[0][1].closed  # an unsolicited answer: never reused
    assert await _post(client) == (200, b"{}")
    assert len(pod.connections) == 2


async def test_idle_connections_per_host_are_capped_and_forgotten():
    pod = _Pod([[OK]], [[OK]], [[OK]])
    client = _client(pod, max_idle_per_host=1)
    responses = [
        await client.request("POST", URL, b"", [], connect_timeout=1, head_timeout=1)
        for _ in range(2)
    ]
    for response in responses:
        await read_all(response)
    writers = [w for _r, w in pod.connections]
    assert [w.closed for w in writers] == [False, True]  # one kept idle, one over the cap
    client.forget("http://pod:8000")
    assert writers[0].closed
    await _post(client)
    assert len(pod.connections) == 3
    await client.aclose()
    assert pod.connections[2][1].closed


async def test_an_answer_read_after_its_pod_left_does_not_keep_its_connection():
    """Kubernetes drops a terminating pod at once, while answers are still read from it: their
    connections were handed back to the forgotten host and sat in CLOSE_WAIT."""
    pod = _Pod([[OK]], [[OK]])
    client = _client(pod)
    response = await client.request("POST", URL, b"", [], connect_timeout=1, head_timeout=1)
    client.forget("http://pod:8000")  # the pod left while its answer was read
    await read_all(response)
    assert pod.connections[0][1].closed and client._idle == {}
    client.know(URL)  # the address came back (another pod): its connections are kept
    await _post(client)
    assert not pod.connections[1][1].closed and len(client._idle[("pod", 8000)]) == 1
    await client.aclose()


async def test_a_request_sent_after_its_pod_left_does_not_keep_its_connection():
    """A request planned before its pod left (routing awaits the directory) or a scrape round
    begun before is sent after `forget`: its connection was kept under the host again, and
    nothing ever asked for that host again (a descriptor per departed pod, in CLOSE_WAIT)."""
    pod = _Pod([[OK]])
    client = _client(pod)
    client.forget(URL)
    await _post(client)
    assert pod.connections[0][1].closed and client._idle == {}
    await client.aclose()


class _Body:
    """An upstream response that sends `chunks` and records that it was released."""

    status = 200
    headers: list[tuple[bytes, bytes]] = []

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self.closed = False

    async def chunks(self):  # type: ignore[no-untyped-def]
        for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


async def test_read_all_refuses_a_body_past_its_bound_and_releases_the_connection() -> None:
    small = _Body([b"ab", b"cd"])
    assert await read_all(small, max_bytes=4) == b"abcd" and small.closed
    big = _Body([b"ab", b"cd", b"e"])
    with pytest.raises(UpstreamError, match="over 4 bytes"):
        await read_all(big, max_bytes=4)
    assert big.closed
