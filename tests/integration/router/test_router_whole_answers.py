"""A real router in front of a real HTTP pod that, as vLLM does, sends a whole (non-stream)
answer's head only once the answer is generated: a long answer is no pod failure."""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import (
    canned_pod,
    completion_answer,
    router_before_pod,
    router_config,
    running_router,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ANSWER = completion_answer(text="a long answer", completion_tokens=600)


async def test_a_whole_answer_longer_than_the_first_byte_timeout_is_waited_for_once(
    tmp_path: Path,
) -> None:
    """Its head comes once all of it is generated. Waited for only `first_byte_timeout`, it
    ran on every pod in turn (each computing it again), ended in a 504, and each attempt
    counted as a pod failure: three such answers ejected every healthy pod."""
    asked: list[float] = []
    lock = threading.Lock()

    def answer(body: dict[str, Any]) -> tuple[bytes, str]:
        with lock:
            asked.append(time.monotonic())
        time.sleep(1.5)  # the generation: longer than the first-byte timeout below
        return ANSWER, "application/json"

    limits = {"first_byte_timeout_seconds": 0.5, "max_answer_seconds": 10}
    with router_before_pod(canned_pod(answer), tmp_path, limits=limits) as (proc, _pod):
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
            for _ in range(3):
                body = {"model": "m", "prompt": "hello", "max_tokens": 600}
                got = await client.post("/v1/completions", json=body)
                assert got.status_code == 200, got.text
                assert got.json()["usage"]["completion_tokens"] == 600
            ready = (await client.get("/ready")).json()
    assert len(asked) == 3  # once each, never retried
    assert ready["ready"] is True, ready


class _Drip(socketserver.StreamRequestHandler):
    """A pod that sends its head after 0.9 s, then each piece of its answer 0.9 s apart (each
    gap under every limit of the test below, the sum over the first-byte one)."""

    def handle(self) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += self.request.recv(65536)
        head, _, rest = request.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )  # fmt: skip
        while len(rest) < length:
            rest += self.request.recv(65536)
        stream = json.loads(rest).get("stream") is True
        kind = b"text/event-stream" if stream else b"application/json"
        pieces = (
            [b'data: {"choices": [{"index": 0, "text": "hi"}]}\n\n', b"data: [DONE]\n\n"]
            if stream
            else [ANSWER[:20], ANSWER[20:]]
        )
        with contextlib.suppress(ConnectionError):
            time.sleep(0.9)
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: "
                + kind
                + b"\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for piece in pieces:
                time.sleep(0.9)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")


async def test_the_first_byte_and_a_whole_answer_have_one_deadline_each(tmp_path: Path) -> None:
    """The head and the first chunk each waited a whole `first_byte_timeout` (a stream's first
    byte came at 1.8 s with a limit of 1 s), and a whole answer's body had `max_answer_seconds`
    again after its head (all of it at 2.7 s with first byte + answer = 2 s)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Drip)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    limits = {
        "first_byte_timeout_seconds": 1.0,
        "max_answer_seconds": 1.0,
        "read_timeout_seconds": 5.0,
        "max_retries": 0,
    }
    config = router_config([f"http://127.0.0.1:{server.server_address[1]}"], limits=limits)
    try:
        with running_router(tmp_path, config) as proc:
            async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
                for stream in (True, False):
                    body = {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream}
                    got = await client.post("/v1/completions", json=body)
                    assert got.status_code == 504, (stream, got.text)
    finally:
        server.shutdown()
        server.server_close()
