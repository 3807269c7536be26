"""Follow one vLLM pod's KV events (ZMQ) and apply them to the directory.

Wire format (vLLM `ZmqEventPublisher`): PUB multipart `[topic, seq, payload]`, `seq` an 8-byte
big-endian counter that starts at 0 when the engine process starts. The replay socket is a
ROUTER: a DEALER sends `["", start_seq]` and receives `["", topic, seq, payload]` (vLLM >= 0.11;
older releases omit the topic) for every buffered batch with seq >= start, then an end marker
whose seq is -1.

Algorithm, with `expected` = the next seq this subscriber needs (None before the first message):

* On start: a fresh generation (`<pod generation>#<random token>.<restarts>`) is set, which
  drops whatever a previous indexer left for the pod: it cannot tell which of those are true.
* seq == expected: apply. seq > expected, or a first message with seq > 0: a gap; replay
  [expected or 0, seq) and apply it. If the replay is unavailable or incomplete, a mid-stream
  gap clears the pod (a missed BlockRemoved would leave stale entries); a first-message gap just
  applies what the buffer still has (older stores are unknown, which can only under-report).
* seq < expected: the engine restarted (seq went back, normally to 0): new generation, which
  clears the pod at once, then seq > 0 is handled as a first-message gap.
* Payloads that do not decode, frames that are not `[topic, seq, payload]`, messages for
  another topic (ZMQ subscriptions match prefixes), rejected events: counted, logged once,
  skipped. Events of other KV cache groups than `kv_cache_group` are skipped (hybrid models).
* If the directory fails (Redis down), the batch's seq becomes `expected` again after a short
  back-off, so the next message triggers a replay and the directory catches up.

Messages that queued up while the previous ones were written are drained together (up to
`drain_messages`) and consecutive events of the same kind and medium are coalesced: under load,
one directory call covers many batches.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex
from kvgate.directory.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_batch,
)
from kvgate.directory.metrics import DirectoryMetrics, LogOnce
from kvgate.prefix import BlockKey

log = logging.getLogger(__name__)

END_SEQ = -1


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where one pod publishes KV events. Equal endpoints need no resubscription."""

    pod: str  # the directory's pod id
    events: str  # ZMQ PUB endpoint, e.g. tcp://10.0.0.5:5557
    replay: str | None = None  # ZMQ ROUTER replay endpoint, e.g. tcp://10.0.0.5:5558
    topic: str = ""  # e.g. kv@10.0.0.5@<model>; "" = every message of the socket
    generation: str = ""  # pod UID (+ restart count); "" = the pod id


@dataclass(slots=True)
class _Op:
    op: str  # add | remove | clear
    medium: str
    keys: list[BlockKey]


class PodSubscriber:
    """Subscribe to one pod; `run()` until cancelled."""

    def __init__(
        self,
        endpoint: PodEndpoint,
        index: BlockIndex,
        context: zmq.asyncio.Context,
        *,
        pool: str = "",
        metrics: DirectoryMetrics | None = None,
        replay_timeout_seconds: float = 2.0,
        kv_cache_group: int | None = 0,
        retry_seconds: float = 0.5,
        drain_messages: int = 256,
    ) -> None:
        self.endpoint = endpoint
        self._index = index
        self._context = context
        self._pool = pool
        self._metrics = metrics
        self._replay_timeout = replay_timeout_seconds
        self._group = kv_cache_group
        self._retry = retry_seconds
        self._token = secrets.token_hex(4)
        self._restarts = 0
        self._log = LogOnce(log)
        self._drain = drain_messages
        self._topic = endpoint.topic.encode()
        self._ops: list[_Op] = []  # queued directory writes, coalesced
        self._ops_from: int | None = None  # seq of the first batch in _ops
        self._batches = 0
        self.expected: int | None = None
        self.generation = self._next_generation()

    def _next_generation(self) -> str:
        base = self.endpoint.generation or self.endpoint.pod
        return f"{base}#{self._token}.{self._restarts}"

    async def open(self) -> None:
        """Announce this subscription's generation of the pod in the directory (the first thing
        `run` does; a caller that feeds `handle` itself calls it once before)."""
        await self._new_generation("start")

    async def run(self) -> None:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        sock.connect(self.endpoint.events)
        try:
            await self.open()
            while True:
                messages = [await sock.recv_multipart()]
                while len(messages) < self._drain:  # what queued up meanwhile: one write for all
                    try:
                        messages.append(await sock.recv_multipart(flags=zmq.NOBLOCK))
                    except zmq.Again:
                        break
                try:
                    await self.handle_many(messages)
                except Exception as exc:  # the directory failed mid-way: start over cleanly
                    self._log.warning(("handle", self.endpoint.pod),
                                      "pod %s: %s; resynchronising", self.endpoint.pod, exc)  # fmt: skip
                    if self._metrics:
                        self._metrics.bad_events.labels(self._pool, "directory_error").inc()
                    await asyncio.sleep(self._retry)
                    await self._restart("error")
        finally:
            sock.close(linger=0)

    async def handle(self, frames: Sequence[bytes]) -> None:
        """Process one PUB message `[topic, seq, payload]`."""
        await self.handle_many([frames])

    async def handle_many(self, messages: Sequence[Sequence[bytes]]) -> None:
        """Process PUB messages in order; their directory writes are coalesced and flushed once."""
        for frames in messages:
            await self._handle_one(frames)
        await self._flush()

    async def _handle_one(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._bad("malformed_frame", f"{len(frames)} frames")
            return
        topic, seq_bytes, payload = frames
        if self._topic and topic != self._topic:  # a ZMQ subscription matches prefixes only
            self._bad("unknown_pod", f"topic {topic[:80]!r}")
            return
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        expected = self.expected
        if expected is not None and seq < expected:
            log.info("pod %s: seq %d after %d: engine restarted", self.endpoint.pod, seq, expected)
            self._ops.clear()  # writes for the old engine are moot
            await self._restart("restart")
            expected = None
        if expected is None and seq > 0:
            await self._replay(0, seq, clear_if_incomplete=False)
        elif expected is not None and seq > expected:
            if self._metrics:
                self._metrics.seq_gaps.labels(self._pool).inc()
            await self._replay(expected, seq, clear_if_incomplete=True)
        self._apply_payload(seq, payload)

    async def _replay(self, start: int, stop: int, *, clear_if_incomplete: bool) -> None:
        """Apply batches [start, stop) from the replay socket; on failure maybe clear the pod."""
        await self._flush()
        got = await self._fetch_replay(start, stop)
        complete = [seq for seq, _ in got] == list(range(start, stop))
        outcome = "ok" if complete else ("partial" if got else "failed")
        if self._metrics:
            self._metrics.replays.labels(self._pool, outcome).inc()
        if not complete and clear_if_incomplete:
            self._ops.clear()
            self._log.warning(
                ("gap", self.endpoint.pod),
                "pod %s: seq gap [%d, %d) not replayable (%s): clearing the pod",
                self.endpoint.pod, start, stop, outcome,
            )  # fmt: skip
            self._count_clear("gap")
            await self._index.clear_pod(self.endpoint.pod)
            return
        for seq, payload in got:
            self._apply_payload(seq, payload)

    async def _fetch_replay(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Batches with start <= seq < stop, in order, as the replay socket gives them."""
        if not self.endpoint.replay:
            return []
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint.replay)
        got: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(int(self._replay_timeout * 1000)):
                    self._log.warning(("replay-timeout", self.endpoint.pod),
                                      "pod %s: replay timed out", self.endpoint.pod)  # fmt: skip
                    return got
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) == 3:  # vLLM >= 0.11 sends the topic too
                    frames = frames[1:]
                if len(frames) != 2 or len(frames[0]) != 8:
                    self._bad("malformed_frame", "replay frame")
                    return got
                seq = int.from_bytes(frames[0], "big", signed=True)
                if seq == END_SEQ:
                    return got
                if start <= seq < stop:
                    got.append((seq, frames[1]))
        finally:
            sock.close(linger=0)

    def _apply_payload(self, seq: int, payload: bytes) -> None:
        """Decode a batch and queue its writes (flushed by `_flush`)."""
        self.expected = seq + 1
        if self._ops_from is None:
            self._ops_from = seq
        try:
            batch = decode_batch(payload, check_token_ids=False)
        except EventDecodeError as exc:
            self._bad(exc.reason, exc.detail)
            return
        for rejected in batch.rejected:
            self._bad(rejected.reason, rejected.detail)
        if self._metrics:  # engine clock to ours: wall clocks, so lag includes any skew
            self._metrics.event_lag.labels(self._pool).observe(max(0.0, time.time() - batch.ts))
            # One `labels()` per event type, not per event: it costs more than the update.
            for kind, count in Counter(type(e).__name__ for e in batch.events).items():
                self._metrics.events.labels(self._pool, kind).inc(count)
        self._batches += 1
        ops = self._ops
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self._count_clear("all_blocks_cleared")
                ops.clear()  # everything before is moot
                ops.append(_Op("clear", DEFAULT_MEDIUM, []))
                continue
            assert isinstance(event, BlockStored | BlockRemoved)
            if self._group is not None and event.group_idx not in (None, self._group):
                self._bad("other_kv_cache_group", f"group {event.group_idx}")
                continue
            op = "add" if isinstance(event, BlockStored) else "remove"
            medium = event.medium or DEFAULT_MEDIUM
            if ops and ops[-1].op == op and ops[-1].medium == medium:
                ops[-1].keys.extend(event.keys)
            else:
                ops.append(_Op(op, medium, list(event.keys)))

    async def _flush(self) -> None:
        """Apply the queued writes in order. If the directory fails, the seq of the first
        unapplied batch becomes `expected` again, so the next message replays from there."""
        ops, first, batches = self._ops, self._ops_from, self._batches
        self._ops, self._ops_from, self._batches = [], None, 0
        pod, gen = self.endpoint.pod, self.generation
        try:
            for op in ops:
                if op.op == "clear":
                    await self._index.clear_pod(pod)
                    continue
                write = self._index.add if op.op == "add" else self._index.remove
                if not await write(pod, op.keys, medium=op.medium, generation=gen):
                    self._bad("stale_generation", f"generation {gen} superseded")
        except Exception as exc:
            self._log.warning(("apply", pod),
                              "pod %s: directory write failed (%s); will replay from seq %s",
                              pod, exc, first)  # fmt: skip
            if self._metrics:
                self._metrics.bad_events.labels(self._pool, "directory_error").inc()
            if first is not None:
                self.expected = first
            await asyncio.sleep(self._retry)
            return
        if self._metrics and batches:
            self._metrics.event_batches.labels(self._pool).inc(batches)

    async def _restart(self, reason: str) -> None:
        """Forget everything known about the pod: new generation, no expected seq."""
        self._ops, self._ops_from, self._batches = [], None, 0
        self._restarts += 1
        self.generation = self._next_generation()
        self.expected = None
        await self._new_generation(reason)

    async def _new_generation(self, reason: str) -> None:
        """Set `self.generation` in the directory, retrying until the directory answers."""
        self._count_clear(reason)
        while True:
            try:
                await self._index.set_generation(self.endpoint.pod, self.generation)
                return
            except Exception as exc:
                self._log.warning(("generation", self.endpoint.pod),
                                  "pod %s: cannot set generation (%s); retrying",
                                  self.endpoint.pod, exc)  # fmt: skip
                await asyncio.sleep(self._retry)

    def _count_clear(self, reason: str) -> None:
        if self._metrics:
            self._metrics.pod_clears.labels(self._pool, reason).inc()

    def _bad(self, reason: str, detail: str) -> None:
        if self._metrics:
            self._metrics.bad_events.labels(self._pool, reason).inc()
        self._log.warning((reason, self.endpoint.pod), "pod %s: skipped (%s): %s",
                          self.endpoint.pod, reason, detail)  # fmt: skip
