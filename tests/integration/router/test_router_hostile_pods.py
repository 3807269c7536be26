"""A real `kvgate router` process in front of a real HTTP pod that answers in ways no engine
should: a stream event that never ends, a whole answer that never ends, one byte then silence,
headers that never end. Each answer costs the router bounded time and memory, ends with a clear
error for its client, and leaves the router serving a good pod meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.integration.router.edge_helpers import (
    RouterProcess,
    completion_answer,
    router_config,
    running_router,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MIB = 1 << 20
ANSWER = completion_answer("good")


CHUNKED_JSON = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
)
HOSTILE: dict[str, tuple[bytes, bytes, int, bool]] = {
    # prompt: (head, piece repeated, bytes of pieces before silence, pieces chunk-framed)
    "endless-event": (  # one SSE event, 64 MiB and never finished
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        b"data: " + b"x" * (64 * 1024 - 6),
        64 * MIB,
        True,
    ),
    # a whole answer past the router's 64 MiB default (before: all of it held, then a hang)
    "endless-json": (CHUNKED_JSON + b"\r\n", b'{"x": "' + b"a" * (64 * 1024 - 7), 160 * MIB, True),
    "one-byte": (  # one byte of a 100-byte answer, then silence
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
        b"{",
        1,
        False,
    ),
    # 2 MiB of headers (~350,000 of them), then silence: the head never ends
    "endless-head": (b"HTTP/1.1 200 OK\r\n", b"x: y\r\n" * 10_000, 2 * MIB, False),
}


# prompt: (head, piece sent every 0.2 s, chunk-framed, for as long as the router listens)
DRIP: dict[str, tuple[bytes, bytes]] = {
    "drip-events": (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n',
    ),
    "drip-json": (CHUNKED_JSON + b"\r\n", b" "),
    "drip-500": (
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n",
        b" ",
    ),
}


class Pod(socketserver.StreamRequestHandler):
    """One request per connection. `POST` answers as its prompt says (`HOSTILE`); any other
    prompt gets a normal answer. `asked` counts the requests per prompt, over every pod."""

    asked: Counter[str] = Counter()

    def handle(self) -> None:
        head = [self.rfile.readline()]
        while head[-1] not in (b"\r\n", b""):
            head.append(self.rfile.readline())
        length = next(
            (
                int(line.split(b":")[1])
                for line in head
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        prompt = json.loads(self.rfile.read(length)).get("prompt") if length else None
        Pod.asked[str(prompt)] += 1
        try:
            if prompt in DRIP:
                self._drip(*DRIP[prompt])
            elif prompt in HOSTILE:
                head, piece, total_bytes, chunked = HOSTILE[prompt]
                self._endless(head, piece, total_bytes=total_bytes, chunked=chunked)
            else:
                body = ANSWER if head[0].startswith(b"POST") else b""
                self.wfile.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
        except OSError:
            pass  # the router hung up: what a hostile answer should come to

    def _drip(self, head: bytes, piece: bytes) -> None:
        """`head`, then one chunk of `piece` every 0.2 s until the router hangs up."""
        self.wfile.write(head)
        while True:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.2)

    def _endless(self, head: bytes, piece: bytes, *, total_bytes: int, chunked: bool) -> None:
        """`head`, then `piece` until `total_bytes` were sent, then silence until the router
        closes the connection (a pod cannot tell the router more than it already did)."""
        self.wfile.write(head)
        sent = 0
        while sent < total_bytes:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
        self.rfile.read(1)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def _pod() -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), Pod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    """A router with pool `hostile` (model `hostile`) and pool `good` (model `good`)."""
    with _pod() as hostile, _pod() as good:
        pools = [
            {"name": name, "model": name, "endpoints": {"static": [{"url": url}]}}
            for name, url in (("hostile", hostile), ("good", good))
        ]
        config = router_config([], pools=pools, limits={"read_timeout_seconds": 2})
        with running_router(tmp_path, config) as proc:
            yield proc


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


async def _good_latencies(client: httpx.AsyncClient, until: asyncio.Event) -> list[float]:
    """Seconds each good request took, sent one after another until `until` (at least 5)."""
    latencies: list[float] = []
    while not until.is_set() or len(latencies) < 5:
        started = time.perf_counter()
        got = await client.post("/v1/completions", json={"model": "good", "prompt": "hello"})
        assert got.status_code == 200, got.text
        latencies.append(time.perf_counter() - started)
    return latencies


async def test_a_stream_event_that_never_ends_fails_the_stream_in_bounded_time_and_memory(
    router: RouterProcess,
) -> None:
    rss_before = _rss_kib(router.proc.pid, "VmRSS")
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:

        async def hostile_stream() -> tuple[int, bytes, float]:
            started = time.perf_counter()
            try:
                body = {"model": "hostile", "prompt": "endless-event", "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as got:
                    return got.status_code, await got.aread(), time.perf_counter() - started
            finally:
                done.set()

        (status, text, seconds), latencies = await asyncio.gather(
            hostile_stream(), _good_latencies(client, done)
        )
    # The stream had started (200), so the client learns of the failure in the stream itself,
    # without the 16 MiB of the unfinished event.
    assert status == 200
    assert b'"type": "upstream_error"' in text and b"[DONE]" not in text, text[:300]
    assert len(text) < MIB
    assert seconds < 20, f"the error came after {seconds:.1f} s"
    assert max(latencies) < 2.0, f"good requests took up to {max(latencies):.2f} s"
    grown_mib = (_rss_kib(router.proc.pid, "VmHWM") - rss_before) / 1024
    assert grown_mib < 64, f"router RSS peaked {grown_mib:.0f} MiB above its start"
    assert router.metric("kvgate_router_upstream_errors_total") >= 1
    assert not router.error_lines(), router.error_lines()


@pytest.mark.parametrize(
    ("prompt", "status", "rss_bound_mib"),
    [("endless-json", 502, 128), ("one-byte", 504, 32), ("endless-head", 502, 32)],
)
async def test_a_whole_answer_that_never_ends_is_a_clear_error_in_bounded_time_and_memory(
    router: RouterProcess, prompt: str, status: int, rss_bound_mib: int
) -> None:
    rss_before = _rss_kib(router.proc.pid, "VmRSS")
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
        started = time.perf_counter()
        got = await client.post("/v1/completions", json={"model": "hostile", "prompt": prompt})
        seconds = time.perf_counter() - started
        assert got.status_code == status, got.text[:300]
        assert got.json()["error"]["type"] == "upstream_error"
        assert seconds < 20, f"the error came after {seconds:.1f} s"
        good = await client.post("/v1/completions", json={"model": "good", "prompt": "hello"})
        assert good.status_code == 200 and good.json()["choices"][0]["text"] == "hi"
    grown_mib = (_rss_kib(router.proc.pid, "VmHWM") - rss_before) / 1024
    assert grown_mib < rss_bound_mib, f"router RSS peaked {grown_mib:.0f} MiB above its start"
    assert router.metric("kvgate_router_upstream_errors_total") >= 1
    assert not router.error_lines(), router.error_lines()


async def test_an_answer_over_the_size_limit_is_not_retried_on_another_pod(tmp_path: Path) -> None:
    """A whole answer past `max_response_bytes` is the request's doing as much as the pod's:
    another pod would write it again. One attempt, then a 502 (before: every pod tried, up to
    `max_retries` + 1 answers of 64 MiB read and dropped)."""
    with _pod() as first, _pod() as second:
        pool = {"name": "hostile", "model": "hostile"}
        pools = [{**pool, "endpoints": {"static": [{"url": first}, {"url": second}]}}]
        limits = {"read_timeout_seconds": 2, "max_response_bytes": MIB}
        config = router_config([], pools=pools, limits=limits)
        with running_router(tmp_path, config) as proc:
            Pod.asked.clear()
            async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
                body = {"model": "hostile", "prompt": "endless-json"}
                got = await client.post("/v1/completions", json=body)
            assert got.status_code == 502, got.text[:300]
            assert "over 1048576 bytes" in got.json()["error"]["message"]
            assert Pod.asked["endless-json"] == 1
            assert proc.metric("kvgate_router_retries_total") == 0


@pytest.mark.parametrize("prompt", ["drip-events", "drip-json"])
async def test_an_answer_that_drips_forever_ends_at_max_answer_seconds(
    tmp_path: Path, prompt: str
) -> None:
    """Each gap well under `read_timeout_seconds`, for ever: the stream ends with the
    `upstream_error` event, the whole answer is a 504, both `max_answer_seconds` after the first
    byte (before: the client waited as long as the pod kept dripping)."""
    limits = {"read_timeout_seconds": 5, "max_answer_seconds": 1.5}
    body = {"model": "hostile", "prompt": prompt, "stream": prompt == "drip-events"}
    got, seconds = await _timed_answer(tmp_path, limits, body)
    assert 1.4 < seconds < 5, f"the answer ended after {seconds:.1f} s"
    if prompt == "drip-events":
        assert got.status_code == 200
        events = got.text.strip().split("\n\n")
        assert events[0].startswith("data: {") and len(events) > 3
        assert '"type":"upstream_error"' in events[-1].replace(" ", ""), events[-1]
    else:
        assert got.status_code == 504, got.text[:300]
        assert "did not end in time" in got.json()["error"]["message"]


async def test_a_failed_answer_whose_body_drips_forever_is_left_within_one_read_timeout(
    tmp_path: Path,
) -> None:
    """A pod answers 500 and drips its body, each gap under `read_timeout_seconds`: the router
    reads a failed answer's body only to reuse the connection, for one read timeout in all, then
    answers (before: the client waited as long as the pod kept dripping)."""
    limits = {"read_timeout_seconds": 1.0, "max_answer_seconds": 60}
    body = {"model": "hostile", "prompt": "drip-500"}
    got, seconds = await _timed_answer(tmp_path, limits, body)
    assert seconds < 5, f"the answer came after {seconds:.1f} s"
    assert got.status_code >= 500, got.text[:300]


async def _timed_answer(
    tmp_path: Path, limits: dict[str, float], body: dict[str, object]
) -> tuple[httpx.Response, float]:
    """`body`'s answer from a router in front of one hostile pod, and how long it took."""
    with _pod() as pod:
        pools = [{"name": "hostile", "model": "hostile", "endpoints": {"static": [{"url": pod}]}}]
        with running_router(tmp_path, router_config([], pools=pools, limits=limits)) as proc:
            async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
                started = time.perf_counter()
                got = await client.post("/v1/completions", json=body)
                return got, time.perf_counter() - started
