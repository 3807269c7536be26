"""`kvgate sim fleet`: several pods in one process, each with its own port, metrics and events."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import zmq
from tests.integration.conftest import free_port, free_port_range
from tests.integration.sim.processes import SimFactory, SimProcess

from kvgate.kvevents import BlockStored, decode_batch
from kvgate.promtext import sum_samples

HITS = "vllm:prefix_cache_hits_total"


def test_fleet_pods_are_independent(start_sim: SimFactory) -> None:
    [kv_base] = free_port_range(3)
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
            assert topic == b"kv@127.0.0.1@m"
            stored = [e for e in decode_batch(payload).events if isinstance(e, BlockStored)]
            assert stored and stored[0].token_ids == prompt[:96]
        finally:
            sub.close(linger=0)
            ctx.term()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # another pod
        hits = [
            sum_samples(client.get(url + "/metrics").text, [HITS])[HITS] for url in fleet.urls()
        ]
        assert hits == [0.0, 96.0, 0.0]


def test_fleet_on_one_address_per_pod(tmp_path: Path) -> None:
    """`--hosts`: every pod on the same port of its own address (here 127.0.0.2, 127.0.0.3)."""
    port = free_port()
    proc = SimProcess(
        ["fleet", "--pods", "2", "--base-port", str(port), "--hosts", "127.0.0.2,127.0.0.3",
         "--model", "m", "--max-model-len", "4096"],
        [port], tmp_path / "hosts.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        urls = [f"http://127.0.0.2:{port}", f"http://127.0.0.3:{port}"]
        with httpx.Client(timeout=5) as client:
            for url in urls:
                while True:
                    assert proc.proc.poll() is None, proc.log_path.read_text()
                    try:
                        if client.get(url + "/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, proc.log_path.read_text()
                        time.sleep(0.1)
            body = {"model": "m", "prompt": list(range(64)), "max_tokens": 1}
            first = client.post(urls[0] + "/v1/completions", json=body)
            assert first.status_code == 200
            second = client.post(urls[1] + "/v1/completions", json=body)
            assert second.status_code == 200
            metrics = client.get(urls[1] + "/metrics").text
            assert "vllm:prefix_cache_hits_total" in metrics
    finally:
        proc.stop()
