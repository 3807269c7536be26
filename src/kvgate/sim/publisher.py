"""KV event publisher: ZMQ PUB plus a replay ROUTER, as vLLM's ``ZmqEventPublisher``.

- Each step that produced events publishes one batch as the multipart message
  ``[topic, seq (8-byte big-endian), payload]``; ``seq`` counts from 0 and starts again at 0
  when the engine restarts.
- The last ``buffer_steps`` ``(seq, payload)`` pairs are kept. A client sends
  ``[identity, b"", start_seq (8 bytes)]`` to the ROUTER socket (a DEALER with an empty delimiter
  frame, or REQ) and receives ``[b"", topic, seq, payload]`` for every buffered batch with
  ``seq >= start_seq``, then the end marker ``[b"", b"", seq=-1, b""]``.
- Endpoints containing ``*`` or ``::`` (or ipc/inproc) are bound, others connected, as in vLLM
  (a fleet binds its per-pod addresses explicitly with ``bind=True``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from kvgate.kvevents import EventBatch, KVEvent, encode_batch
from kvgate.sim.config import KVEventsConfig
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _is_bind_endpoint(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    def __init__(
        self,
        config: KVEventsConfig,
        context: zmq.asyncio.Context,
        int_hashes: bool = False,
        data_parallel_rank: int = 0,
        bind: bool | None = None,
    ) -> None:
        self.config = config
        self._int_hashes = int_hashes
        self._dp_rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._pub_async = context.socket(zmq.PUB)
        self._pub_async.set_hwm(config.hwm)
        self._pub_async.setsockopt(zmq.LINGER, 0)
        if bind or (bind is None and _is_bind_endpoint(config.endpoint)):
            self._pub_async.bind(config.endpoint)
        else:
            self._pub_async.connect(config.endpoint)
        # A synchronous view of the same socket: PUB never blocks, so sends need no awaiting.
        self._pub: zmq.Socket[bytes] = zmq.Socket.shadow(self._pub_async.underlying)
        self._replay: zmq.asyncio.Socket | None = None
        if config.replay_endpoint:
            self._replay = context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(config.replay_endpoint)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim-kv-replay")

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(
            EventBatch(time.time(), events, self._dp_rank), int_hashes=self._int_hashes
        )
        seq = self._seq
        self._seq += 1
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
        except zmq.Again:  # pragma: no cover - PUB drops rather than blocks
            log.warning("KV event batch %d dropped", seq)
        self._buffer.append((seq, payload))

    def restart(self) -> None:
        """An engine restart: sequence numbers start again at 0 and the buffer is lost."""
        self._seq = 0
        self._buffer.clear()

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid replay request with %d frames", len(frames))
                continue
            client, _empty, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            await sock.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._pub_async.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
