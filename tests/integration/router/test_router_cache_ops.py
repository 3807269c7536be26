"""AKV cache ops end to end: `kvgate sim serve --sim-akv` pods (and a `kvgate sim fleet` of
them) publish KV events whose keys carry each request's op history; a real `kvgate router`
process keys the same history the same way and routes a session's next turn onto its own
dropped history (ops the client sends, or the router's rolling drop); a pool whose engines do
not support ops never receives the `cache` field (a recording HTTP proxy in front of its pod
sees every body the router sends)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.conftest import free_port
from tests.integration.router.router_process import RouterProcess

SEG = 160  # tokens per segment: 10 blocks of 16


class RecordingProxy:
    """Forwards every request to `target` and keeps the JSON bodies of the POSTs."""

    def __init__(self, target: str) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, data: bytes | None) -> None:
                headers = {"content-type": self.headers.get("content-type", "application/json")}
                request = urllib.request.Request(
                    target + self.path, data=data, headers=headers, method=self.command
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, body = response.status, response.read()
                        ctype = response.headers.get("content-type", "application/json")
                except urllib.error.HTTPError as err:
                    status, body = err.code, err.read()
                    ctype = "application/json"
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.bodies.append(json.loads(data))
                self._forward(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def recording_proxy() -> Iterator[type[RecordingProxy]]:
    started: list[RecordingProxy] = []

    class Started(RecordingProxy):
        def __init__(self, target: str) -> None:
            super().__init__(target)
            started.append(self)

    yield Started
    for proxy in started:
        proxy.close()


def _segment(i: int) -> list[int]:
    return [100 + (i * 131 + t * 17) % 2900 for t in range(SEG)]


def _turn(num_segments: int, drop: dict[str, list[int]], model: str = "m") -> dict[str, Any]:
    prompt = [t for i in range(num_segments) for t in _segment(i)]
    cache: dict[str, Any] = {"segments": [SEG] * num_segments, "drop": drop}
    return {"model": model, "prompt": prompt, "max_tokens": 2, "cache": cache}


async def _predicted(client: httpx.AsyncClient, body: dict[str, Any], at_least: int) -> int:
    """The router's predicted hit once the pod's KV events have reached its directory."""
    hit = 0
    for _ in range(200):
        explained = (await client.post("/debug/route", json=body)).json()
        hit = explained["decision"]["predicted_hit_tokens"]
        if hit >= at_least:
            break
        await asyncio.sleep(0.05)
    return int(hit)


async def test_sessions_hit_their_own_dropped_history_and_plain_pods_never_see_ops(
    sim_pods, recording_proxy, tmp_path: Path
) -> None:
    events, replay = free_port(), free_port()
    kv_config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    (akv,) = sim_pods(1, "--sim-akv", "--kv-events-config", json.dumps(kv_config))
    (plain,) = sim_pods(1, "--served-model-name", "plain")
    proxy = recording_proxy(plain.url)
    config = {
        "pools": [
            {
                "name": "akv",
                "model": "m",
                "engine": {"hash_seed": "0", "cache_ops": True},
                "endpoints": {
                    "static": [
                        {
                            "url": akv.url,
                            "kv_events": f"tcp://127.0.0.1:{events}",
                            "kv_replay": f"tcp://127.0.0.1:{replay}",
                        }
                    ]
                },
            },
            {
                "name": "plain",
                "model": "plain",
                "engine": {"hash_seed": "0", "kv_events": False},
                "endpoints": {"static": [{"url": proxy.url}]},
            },
        ],
        "policy": {"seed": 1},
    }
    router = RouterProcess(config, tmp_path)
    try:
        await router.wait_ready()
        await asyncio.sleep(0.3)  # ZMQ subscriptions connect (slow joiner)
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            first = await client.post("/v1/completions", json=_turn(4, {"2": [1]}))
            assert first.status_code == 200, first.text
            assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

            # The next turn resends its drop at 2 and drops segment 3 at 4: it extends turn 1.
            turn2 = _turn(6, {"2": [1], "4": [3]})
            assert await _predicted(client, turn2, 4 * SEG) == 4 * SEG
            second = await client.post("/v1/completions", json=turn2)
            assert second.status_code == 200, second.text
            assert second.headers["x-kvgate-prefix-hit-tokens"] == str(4 * SEG)
            assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * SEG

            # Another session that dropped something else shares only what precedes its drop.
            other = _turn(6, {"2": [0]})
            assert await _predicted(client, other, 3 * SEG) == 3 * SEG
            answer = await client.post("/v1/completions", json=other)
            assert answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * SEG
            # The same history without ops is not a hit of the dropped one past the drop.
            bare = {k: v for k, v in _turn(6, {}).items() if k != "cache"}
            assert await _predicted(client, bare, 0) == 3 * SEG

            # Bad ops: a clear 400, nothing forwarded.
            bad = await client.post("/v1/completions", json=_turn(4, {"7": [1]}))
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "cache"

            # The pool without ops: the router strips `cache` before the pod sees the body.
            for turn in (_turn(4, {"2": [1]}, "plain"), _turn(6, {"2": [1], "4": [3]}, "plain")):
                response = await client.post("/v1/completions", json=turn)
                assert response.status_code == 200, response.text
                assert response.headers["x-kvgate-pool"] == "default/plain"
        assert len(proxy.bodies) == 2
        assert all("cache" not in body for body in proxy.bodies)
        assert all(len(body["prompt"]) >= 4 * SEG for body in proxy.bodies)
    finally:
        router.stop()


async def test_the_routers_rolling_drop_reaches_the_pod_and_its_next_turns_hit(
    sim_fleet, tmp_path: Path
) -> None:
    tokenizer = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
    akv, events, replay = sim_fleet(1, "--sim-akv", "--tokenizer", tokenizer)
    config = {
        "pools": [
            {
                "name": "akv",
                "model": "m",
                "engine": {"hash_seed": "0", "cache_ops": True, "tokenizer": {"path": tokenizer}},
                "endpoints": {
                    "static": [
                        {
                            "url": akv.url,
                            "kv_events": f"tcp://127.0.0.1:{events}",
                            "kv_replay": f"tcp://127.0.0.1:{replay}",
                        }
                    ]
                },
            }
        ],
        "cache_ops": {"rolling_drop": True, "keep_tool_responses": 2},
        "policy": {"seed": 1},
    }
    router = RouterProcess(config, tmp_path)
    try:
        await router.wait_ready()
        await asyncio.sleep(0.3)
        history: list[dict[str, str]] = [
            {"role": "system", "content": "You fix bugs in a repository. " * 20},
            {"role": "user", "content": "The tests fail; find out why."},
        ]
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            previous_prompt = 0
            for turn in range(6):
                history.append({"role": "assistant", "content": f"run step {turn} " * 8})
                history.append({"role": "tool", "content": f"output of step {turn} " * 60})
                body = {"model": "m", "messages": history, "max_tokens": 2}
                if turn >= 3:  # drops from turn 2 on; the pod's events of the last turn arrived
                    await _predicted(client, body, previous_prompt // 2)
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                usage = response.json()["usage"]
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                if turn >= 3:
                    # the whole previous prompt but its generation prompt's last block is a hit:
                    # the ops the router added last turn are resent, extended, this turn
                    assert cached >= previous_prompt - 32, (turn, cached, previous_prompt)
                    assert int(response.headers["x-kvgate-prefix-hit-tokens"]) == cached
                previous_prompt = usage["prompt_tokens"]
    finally:
        router.stop()
