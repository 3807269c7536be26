"""A simulated pod's KV events over real ZMQ sockets, decoded with kvgate's decoder."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import zmq
from tests.integration.sim.processes import SimFactory, SimProcess

from kvgate.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from kvgate.prefix import BlockHasher

TOPIC = "kv@10.1.2.3@m"


class Subscriber:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)

    def recv(self, timeout_ms: int = 5000) -> tuple[bytes, int, bytes]:
        assert self.sock.poll(timeout_ms), "no KV event batch arrived"
        topic, seq, payload = self.sock.recv_multipart()
        return topic, int.from_bytes(seq, "big"), payload

    def drain(self) -> list[tuple[int, object]]:
        """Every event that arrives within a short quiet period, with its batch seq."""
        out: list[tuple[int, object]] = []
        while self.sock.poll(300):
            _topic, seq, payload = self.sock.recv_multipart()
            out.extend((int.from_bytes(seq, "big"), e) for e in decode_batch(payload).events)
        return out


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    """A context whose sockets are all closed after the test."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def subscribe(zctx: zmq.Context[zmq.Socket[bytes]]) -> Iterator[Callable[[str], Subscriber]]:
    subs: list[Subscriber] = []

    def make(endpoint: str) -> Subscriber:
        subs.append(Subscriber(zctx, endpoint))
        return subs[-1]

    yield make
    for sub in subs:
        sub.sock.close(linger=0)


def _serve(start_sim: SimFactory, tmp_path: Path, *extra: str) -> tuple[SimProcess, str, str]:
    pub, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub,
              "replay_endpoint": replay, "topic": TOPIC}  # fmt: skip
    proc = start_sim(
        "--model", "m", "--block-size", "16", "--kv-events-config", json.dumps(config),
        *(extra or ("--max-model-len", "1024")),
    )  # fmt: skip
    return proc, pub, replay


def _complete(pod: SimProcess, tokens: list[int], max_tokens: int = 1) -> httpx.Response:
    resp = pod.client.post(
        "/v1/completions", json={"model": "m", "prompt": tokens, "max_tokens": max_tokens}
    )
    assert resp.status_code == 200, resp.text
    return resp


def test_stored_events_carry_hashes_recomputable_from_tokens(
    start_sim: SimFactory, tmp_path: Path, subscribe: Callable[[str], Subscriber]
) -> None:
    pod, pub, _replay = _serve(start_sim, tmp_path)
    sub = subscribe(pub)
    prompt = list(range(5000, 5000 + 100))  # 6 full blocks
    for attempt in range(50):  # a SUB socket misses what is published before it connects
        _complete(pod, [30_000 + attempt] * 17)
        if sub.sock.poll(200):
            break
    sub.drain()
    _complete(pod, prompt)
    topic, _seq, payload = sub.recv()
    assert topic == TOPIC.encode()
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 0
    stored = [e for e in batch.events if isinstance(e, BlockStored)]
    assert len(stored) == 1
    event = stored[0]
    assert event.token_ids == prompt[:96]
    assert event.parent_block_hash is None
    assert event.medium == "GPU" and event.block_size == 16
    # PYTHONHASHSEED=0 in the simulator's environment: vLLM seeds NONE_HASH with it.
    assert event.block_hashes == BlockHasher("sha256", 16, "0").hash_blocks(prompt)


def test_memory_pressure_evicts_least_recently_used_prefixes(
    start_sim: SimFactory, tmp_path: Path, subscribe: Callable[[str], Subscriber]
) -> None:
    # 40 blocks: 39 usable; each prompt below takes 13 blocks (12 cached + 1 partial).
    pod, pub, _replay = _serve(
        start_sim, tmp_path, "--num-gpu-blocks-override", "40", "--max-model-len", "600",
        "--enable-prompt-tokens-details",
    )  # fmt: skip
    sub = subscribe(pub)
    for attempt in range(50):
        _complete(pod, [30_000 + attempt] * 17)
        if sub.sock.poll(200):
            break
    # Blocks cached while the subscriber joined are the oldest: they go first.
    joined = [h for _s, e in sub.drain() if isinstance(e, BlockStored) for h in e.block_hashes]
    prompts = [[6_000 * (k + 1) + t for t in range(200)] for k in range(4)]
    hasher = BlockHasher("sha256", 16, "0")
    hashes = [hasher.hash_blocks(p) for p in prompts]
    _complete(pod, prompts[0])
    _complete(pod, prompts[1])
    _complete(pod, prompts[0])  # touch prefix 0: prefix 1 is now the least recently used
    _complete(pod, prompts[2])
    events = sub.drain()
    assert not any(isinstance(e, BlockRemoved) for _s, e in events)
    _complete(pod, prompts[3])  # 13 new blocks; only the uncached free ones come without eviction
    removed = [h for _s, e in sub.drain() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert len(removed) > len(joined), "a full cache must evict"
    # Least recently freed first: the joining blocks, then prefix 1 tail first (a request's
    # blocks are freed tail first); prefix 0, used more recently, survives.
    assert removed[: len(joined)] == joined
    assert removed[len(joined) :] == hashes[1][::-1][: len(removed) - len(joined)]
    again = _complete(pod, prompts[0]).json()
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}


def test_replay_restart_and_reset(
    start_sim: SimFactory,
    tmp_path: Path,
    zctx: zmq.Context[zmq.Socket[bytes]],
    subscribe: Callable[[str], Subscriber],
) -> None:
    pod, pub, replay = _serve(start_sim, tmp_path)
    sub = subscribe(pub)
    for attempt in range(50):
        _complete(pod, [30_000 + attempt] * 17)
        if sub.sock.poll(200):
            break
    _complete(pod, list(range(700, 760)))
    seqs = [seq for seq, _e in sub.drain()]
    last = max(seqs)

    dealer = zctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay)
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    replayed: list[int] = []
    while True:
        assert dealer.poll(5000)
        frames = dealer.recv_multipart()
        assert frames[0] == b""
        seq = int.from_bytes(frames[2], "big", signed=True)
        if seq == -1:
            assert frames[1] == b"" and frames[3] == b""
            break
        assert frames[1] == TOPIC.encode()
        decode_batch(frames[3])
        replayed.append(seq)
    assert replayed == list(range(1, last + 1))
    dealer.close()

    assert pod.client.post("/reset_prefix_cache").json() == {"success": True}
    assert not sub.sock.poll(300), "an idle engine publishes nothing (as vLLM)"
    _complete(pod, [9, 9, 9])
    first = sub.drain()
    assert isinstance(first[0][1], AllBlocksCleared)

    assert pod.client.post("/sim/restart").status_code == 200
    _complete(pod, list(range(300, 340)))
    after = sub.drain()
    assert after and after[0][0] == 0, "seq starts again at 0 after a restart"
