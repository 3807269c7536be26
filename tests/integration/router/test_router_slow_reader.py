"""A client that stops reading its stream: a real `kvgate router` process in front of a real HTTP
pod streaming 16 MiB. uvicorn holds the app's `send` while the connection's send buffer is full,
with no time limit, so such a client held its request, its flow-control share and the pod's
request for as long as it kept the socket open. Now the connection is aborted once it has read
nothing for `server.write_stall_timeout_seconds`, and the request ends as one whose client left."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.edge_helpers import canned_pod, request_bytes, router_before_pod

pytestmark = pytest.mark.timeout(120)

EVENT = b'data: {"id":"cmpl-1","choices":[{"index":0,"text":"' + b"h" * 1000 + b'"}]}\n\n'
STREAM = EVENT * 16_000 + b"data: [DONE]\n\n"  # 16 MiB: more than any socket buffers
ANSWER = b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}'


def _answer(body: dict[str, Any]) -> tuple[bytes, str]:
    return (STREAM, "text/event-stream") if body.get("stream") else (ANSWER, "application/json")


_POD = canned_pod(_answer)


def test_a_client_that_reads_nothing_of_its_stream_is_cut_off_and_frees_the_pod(
    tmp_path: Path,
) -> None:
    server = {"write_stall_timeout_seconds": 1.0}
    with router_before_pod(_POD, tmp_path, server=server) as (proc, pod):
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", proc.port))
        body = json.dumps({"model": "m", "prompt": "hello", "stream": True}).encode()
        reader.sendall(request_bytes("POST", "/v1/completions", body))
        inflight = f'pool="default/p",upstream="{pod}"'
        deadline = time.monotonic() + 30
        while proc.metric("kvgate_router_inflight_requests", inflight) < 1:
            assert time.monotonic() < deadline, proc.log_text()[-3000:]
            time.sleep(0.05)
        # it reads slowly, 32 KiB every 0.3 s, well under its answer's pace: not cut off
        reader.settimeout(10)
        received = 0
        for _ in range(10):
            want = received + 32 * 1024
            while received < want:
                received += len(reader.recv(want - received))
            time.sleep(0.3)
        assert proc.metric("kvgate_router_connections_closed_total", 'reason="write_stall"') == 0
        # then it reads nothing: a second later the router cuts it off, and its request ends
        while proc.metric("kvgate_router_connections_closed_total", 'reason="write_stall"') < 1:
            assert time.monotonic() < deadline, proc.log_text()[-3000:]
            time.sleep(0.1)
        while proc.metric("kvgate_router_inflight_requests", inflight) > 0:
            assert time.monotonic() < deadline, proc.log_text()[-3000:]
            time.sleep(0.05)
        assert "client disconnected; upstream cancelled" in proc.log_text()
        try:  # what the buffers held, then the end of the connection
            while chunk := reader.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        finally:
            reader.close()
        assert received < len(STREAM)
        got = httpx.post(proc.url + "/v1/completions", json={"model": "m", "prompt": "hi"})
        assert got.status_code == 200 and got.content == ANSWER
    assert not proc.error_lines(), proc.log_text()[-3000:]
