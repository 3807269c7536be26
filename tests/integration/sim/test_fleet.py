"""`kvgate sim fleet`: several pods in one process, each with its own port, metrics and events."""

from __future__ import annotations

import httpx
import zmq
from tests.integration.conftest import free_port
from tests.integration.sim.processes import SimFactory

from kvgate.directory.events import BlockStored, decode_batch


def test_fleet_pods_are_independent(start_sim: SimFactory) -> None:
    kv_base = free_port()
    fleet = start_sim(
        "--model", "m", "--max-model-len", "4096", "--enable-prompt-tokens-details",
        "--kv-events-base-port", str(kv_base), pods=3,
    )  # fmt: skip
    prompt = list(range(2000, 2100))
    with httpx.Client(timeout=30) as client:
        for url in fleet.urls():
            models = client.get(url + "/v1/models").json()
            assert models["data"][0]["id"] == "m"
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"tcp://127.0.0.1:{kv_base + 1}")
            first = second = None
            for attempt in range(50):  # until the subscription is live
                body = {"model": "m", "prompt": [800_000 + attempt] * 17, "max_tokens": 1}
                client.post(fleet.urls()[1] + "/v1/completions", json=body)
                if sub.poll(200):
                    break
            while sub.poll(300):
                sub.recv_multipart()
            body = {"model": "m", "prompt": prompt, "max_tokens": 1}
            first = client.post(fleet.urls()[1] + "/v1/completions", json=body).json()
            second = client.post(fleet.urls()[1] + "/v1/completions", json=body).json()
            other = client.post(fleet.urls()[2] + "/v1/completions", json=body).json()
            topic, _seq, payload = sub.recv_multipart()
            assert topic == f"kv@127.0.0.1:{fleet.ports[1]}@m".encode()
            stored = [e for e in decode_batch(payload).events if isinstance(e, BlockStored)]
            assert stored and stored[0].token_ids == prompt[:96]
        finally:
            sub.close(linger=0)
            ctx.term()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # another pod
        hits = [
            next(
                float(line.split()[-1])
                for line in client.get(url + "/metrics").text.splitlines()
                if line.startswith("vllm:prefix_cache_hits_total")
            )
            for url in fleet.urls()
        ]
        assert hits == [0.0, 96.0, 0.0]
