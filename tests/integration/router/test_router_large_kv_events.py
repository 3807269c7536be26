"""A pod that publishes KV-event batches of nearly `max_message_bytes` (8 MiB) of valid events
cannot stall a real `kvgate router` process: its embedded indexer decodes and applies them in
slices, so the router keeps answering other requests meanwhile, and every event is indexed.
Before, the router's event loop was held for each batch, and for all batches drained with it:
the p99 of requests sent meanwhile was 3.8 s for four batches, against 0.09 s now (a 2-core
machine)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import zmq
import zmq.asyncio
from tests.integration.conftest import free_port
from tests.integration.router.edge_helpers import RouterProcess, router_config

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.events import BlockStored, EventBatch, encode_batch
from kvgate.prefix.hashing import BlockHasher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BIG_BATCHES = 4
PROMPT = list(range(1000, 1000 + 640))  # 40 blocks of 16
REQUESTS_PER_SECOND = 50
P99_BOUND_SECONDS = 1.0  # before: 3.8 s; after: 0.09 s


def _filler(i: int) -> BlockStored:
    """One block of 16 tokens: the costliest valid events to decode per byte."""
    digest = hashlib.sha256(b"filler/%d" % i).digest()
    return BlockStored([digest], None, list(range(16)), 16, medium="GPU", group_idx=0)


def _big_batches() -> tuple[list[bytes], int]:
    """`BIG_BATCHES` payloads just under `max_message_bytes`, the last of which ends with the
    blocks of `PROMPT` (as the router hashes it, seed "0"); and the number of events in all."""
    limit = KvEventsConfig().max_message_bytes - 64 * 1024
    per_batch = limit // len(encode_batch(EventBatch(0.0, [_filler(0)] * 1000, 0))) * 1000
    prompt_blocks = BlockHasher("sha256", 16, "0").hash_blocks(PROMPT)
    prompt_event = BlockStored(prompt_blocks, None, PROMPT, 16, medium="GPU", group_idx=0)
    payloads, events = [], 0
    for b in range(BIG_BATCHES):
        batch = [_filler(b * per_batch + i) for i in range(per_batch)]
        if b == BIG_BATCHES - 1:
            batch[-1] = prompt_event
        payload = encode_batch(EventBatch(time.time(), batch, 0))
        assert len(payload) < KvEventsConfig().max_message_bytes
        payloads.append(payload)
        events += len(batch)
    return payloads, events


@pytest.fixture
async def publisher() -> AsyncIterator[tuple[zmq.asyncio.Socket, str]]:
    """A pod's ZMQ PUB socket (vLLM's default empty topic, no replay socket)."""
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    yield pub, f"tcp://127.0.0.1:{port}"
    context.destroy(linger=0)


@pytest.fixture
def router(tmp_path: Path, publisher: tuple[zmq.asyncio.Socket, str]) -> Iterator[RouterProcess]:
    pod = {"url": f"http://127.0.0.1:{free_port()}", "kv_events": publisher[1]}
    pools = [{"name": "p", "model": "m", "engine": {"hash_seed": "0"},
              "endpoints": {"static": [pod]}}]  # fmt: skip
    proc = RouterProcess(tmp_path, router_config([], pools=pools))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


async def _predicted_hit_tokens(client: httpx.AsyncClient) -> int:
    body = {"model": "m", "prompt": [*PROMPT, 7, 8, 9], "max_tokens": 1}
    explained = (await client.post("/debug/route", json=body)).json()
    return int(explained["decision"]["predicted_hit_tokens"])


async def _timed_health(client: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    assert (await client.get("/health")).status_code == 200
    return time.perf_counter() - started


async def _open_loop_latencies(client: httpx.AsyncClient, until: asyncio.Event) -> list[float]:
    """Seconds each `/health` took, sent every 1/`REQUESTS_PER_SECOND` s whether or not the
    router answered the ones before (a stall delays all that arrive during it), sorted."""
    requests: list[asyncio.Task[float]] = []
    while not until.is_set():
        requests.append(asyncio.create_task(_timed_health(client)))
        await asyncio.sleep(1 / REQUESTS_PER_SECOND)
    return sorted(await asyncio.gather(*requests))


async def test_max_size_batches_of_valid_events_never_stall_the_router(
    router: RouterProcess, publisher: tuple[zmq.asyncio.Socket, str]
) -> None:
    pub, _ = publisher
    payloads, events = _big_batches()
    stored_metric = ("kvgate_directory_events_total", 'pool="default/p",type="BlockStored"')
    limits = httpx.Limits(max_connections=1000)
    async with httpx.AsyncClient(base_url=router.url, timeout=30, limits=limits) as client:
        seq = 0
        while router.metric("kvgate_directory_event_batches_total") == 0:  # slow joiner
            empty = encode_batch(EventBatch(time.time(), [], 0))
            await pub.send_multipart([b"", seq.to_bytes(8, "big"), empty])
            seq += 1
            await asyncio.sleep(0.1)
        indexed = asyncio.Event()
        load = asyncio.create_task(_open_loop_latencies(client, indexed))
        await asyncio.sleep(0.2)
        for payload in payloads:  # at once: the router drains them together
            await pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
            seq += 1
        deadline = time.monotonic() + 60
        while await _predicted_hit_tokens(client) < len(PROMPT):
            assert time.monotonic() < deadline, router.log_text()[-3000:]
            await asyncio.sleep(0.05)
        indexed.set()
        latencies = await load
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"\n{len(latencies)} requests while indexing {BIG_BATCHES} batches of "
          f"{len(payloads[0]) / 2**20:.1f} MiB: p99 {p99:.3f} s, max {latencies[-1]:.3f} s")  # fmt: skip
    assert p99 < P99_BOUND_SECONDS
    assert router.metric(*stored_metric) == events
    assert router.error_lines() == []
