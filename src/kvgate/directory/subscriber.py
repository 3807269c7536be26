"""Follow one vLLM pod's KV events (ZMQ) and apply them to the directory.

Wire format (vLLM `ZmqEventPublisher`): PUB multipart `[topic, seq, payload]`, `seq` an 8-byte
big-endian counter that starts at 0 when the engine process starts. Replays come from the pod's
ROUTER replay socket (`kvgate.directory.replay`), which buffers the last `buffer_steps` batches.

Algorithm, with `expected` = the next seq this subscriber needs (None before the first message):

* On start: a fresh generation (`<pod generation>#<random token>.<restarts>`) is set, which
  drops whatever a previous indexer left for the pod: it cannot tell which of those are true.
* Only messages of the pod's own topic count (exactly; a ZMQ subscription matches prefixes),
  and those with vLLM's default empty topic (an engine started without a topic publishes on
  its own socket, so they are its own);
  a seq with the top bit set (negative as a signed 64-bit int, e.g. 2^64-1) is no seq a vLLM
  counter reaches: such messages are counted (`bad_seq`) and skipped.
* seq == expected: apply. A first message with seq > 0: replay what the pod's buffer still
  holds of [seq - buffer_steps, seq) and apply it (older stores are unknown, which can only
  under-report); a replay that stops before seq clears the pod, as a gap's does.
* seq > expected, a gap: if it is at most `replay_buffer_steps` (vLLM's `buffer_steps`), replay
  [expected, seq) and apply it as it arrives; if the replay is incomplete (no socket, the buffer
  moved on, the deadline or a bound hit) the pod is cleared, since a missed BlockRemoved would
  leave stale entries. A larger jump, up to an absurd 2^63-1, cannot be in any replay buffer: it
  is counted (`seq_jump`), the pod is cleared at once and followed from the new seq. Either way
  the cost is O(1) in the size of the gap: nothing is allocated per missing seq.
* seq < expected: the engine restarted (seq went back, normally to 0): new generation, which
  clears the pod at once, then seq > 0 is handled as a first message.
* Payloads that do not decode, frames that are not `[topic, seq, payload]`, rejected events:
  counted, logged once, skipped (a batch is read up to its 64th rejected event, the rest of it
  counted once as `too_many_rejects`: `kvgate.kvevents.decode`). A batch that lost a removal
  (a rejected `BlockRemoved`, or unread events) clears the pod after its other events
  (`lost_removal`): a block it removed would otherwise stay listed for good. Only events of
  full-attention KV cache groups count (hybrid models, `cache_groups.py`): those of
  sliding-window or mamba groups are skipped quietly, those of a group of unknown kind other
  than `kv_cache_group` are counted and skipped.
  Events of vLLM's CPU offloading tier (medium `CPU`) are indexed only with `offload_tier`
  (the pool's `engine.cpu_offload`), and other media (a disk tier) never, so that an unpriced
  tier never passes for GPU hits.
* If the directory fails (Redis down), the batch's seq becomes `expected` again after a short
  back-off, so the next message triggers a replay and the directory catches up. If some of the
  drained writes had landed, a replay would apply them twice (a repeated store counts as a
  second copy): the pod restarts instead (a new generation, then the late-start replay).

Messages that queued up while the previous ones were written are drained together (up to
`drain_messages`, holding at most the receive queue's bytes) and consecutive events of the same
kind and medium are coalesced: under load, one directory call covers many batches.

A large message is handled in slices, each a few milliseconds, with the event loop free between
them (`DECODE_SLICE_BYTES`, `APPLY_SLICE_EVENTS`, `WRITE_SLICE_KEYS`): in one piece, an 8 MiB
batch of valid events held the router's loop, every client request, for 0.5-1 s. Hashes become
directory keys slice by slice as they are written (an 8 MiB message of int hashes took 0.4 s to
convert in one go). The slices of one pod run in its own task, one after another, so its events
still apply in order; a message smaller than a slice is handled as before, without yielding.
Queued writes are flushed once they hold `FLUSH_QUEUED_HASHES` hashes, even in the middle of
drained messages or a replay, so what waits for one flush is bounded in hashes, not only in the
messages' bytes (a 1 GiB drain of one-byte int hashes would have queued ~56 GiB of keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex
from kvgate.directory.cache_groups import CacheGroupFilter
from kvgate.directory.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    KVEvent,
    directory_keys,
)
from kvgate.directory.metrics import DirectoryMetrics, LogOnce
from kvgate.directory.replay import ReplayRange
from kvgate.kvevents import MEDIUM_CPU
from kvgate.kvevents.decode import BatchDecoder
from kvgate.prefix import BlockKey

log = logging.getLogger(__name__)

MAX_EVENT_LAG_SECONDS = 1e12
"""A batch timestamp that is not a number, or one this far in the past, is the pod's nonsense, not
lag: observing it would leave the histogram's sum at +Inf (or NaN) for good. The batch still
applies; only its lag is not observed."""

DECODE_SLICE_BYTES = 32 * 1024
"""Payload bytes decoded between two yields to the event loop: ~2-3 ms of a 2-core machine for
the costliest valid events (the smallest ones), ~0.6 ms for one large value."""
APPLY_SLICE_EVENTS = 1024
"""Decoded events queued as directory writes between two yields (~5 us each)."""
WRITE_SLICE_KEYS = 4096
"""Block keys of one directory write, and between two yields (~1 ms in memory; 256 Ki keys
of one 8 MiB batch took 56 ms in one call)."""
FLUSH_QUEUED_HASHES = 1 << 18
"""Queued hashes that are written before the next message or replayed batch is read (~20 MB)."""


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where one pod publishes KV events. Equal endpoints need no resubscription."""

    pod: str  # the directory's pod id
    events: str  # ZMQ PUB endpoint, e.g. tcp://10.0.0.5:5557
    replay: str | None = None  # ZMQ ROUTER replay endpoint, e.g. tcp://10.0.0.5:5558
    topic: str = ""  # exactly what the pod publishes, e.g. kv@10.0.0.5@<model> (vLLM's default "")
    generation: str = ""  # pod UID (+ restart count); "" = the pod id


@dataclass(slots=True)
class _Op:
    op: str  # add | remove | clear
    medium: str
    hashes: list[BlockHash]  # as the events carry them: keys only when written


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
        limits: KvEventsConfig | None = None,
        kv_cache_group: int | None = 0,
        offload_tier: bool = False,
        block_size: int | None = None,
        retry_seconds: float = 0.5,
        drain_messages: int = 256,
    ) -> None:
        self.endpoint = endpoint
        self._index = index
        self._context = context
        self._pool = pool
        self._metrics = metrics
        self._limits = limits or KvEventsConfig()
        self._groups = CacheGroupFilter(kv_cache_group)
        self.configure(offload_tier=offload_tier, block_size=block_size)
        self._children: dict[str, Any] = {}  # metric series of this pool (`_series`)
        self._retry = retry_seconds
        self._token = secrets.token_hex(4)
        self._restarts = 0
        self._log = LogOnce(log)
        self._drain = drain_messages
        self._topic = endpoint.topic.encode()
        self._ops: list[_Op] = []  # queued directory writes, coalesced
        self._ops_from: int | None = None  # seq of the first batch in _ops
        self._batches = 0
        self._hashes = 0  # in _ops
        self._rewound = False  # a write failed: `expected` went back, later messages wait
        self.expected: int | None = None
        self.generation = self._next_generation()

    def configure(self, *, offload_tier: bool, block_size: int | None) -> None:
        """The pool's engine settings: which media are indexed, and the block size (the
        router's keys') a `BlockStored` must have."""
        self._media = {DEFAULT_MEDIUM, MEDIUM_CPU} if offload_tier else {DEFAULT_MEDIUM}
        self._block_size = block_size

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
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, self._limits.receive_queue_messages)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: `_handle_one` keeps ours and ""
        sock.connect(self.endpoint.events)
        try:
            await self.open()
            while True:
                messages = [await sock.recv_multipart()]
                held = sum(map(len, messages[0]))
                # what queued up meanwhile: one write for all, holding no more than the queue
                while len(messages) < self._drain and held < self._limits.receive_queue_bytes:
                    try:
                        messages.append(await sock.recv_multipart(flags=zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    held += sum(map(len, messages[-1]))
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
        self._rewound = False
        for frames in messages:
            await self._handle_one(frames)
            if self._hashes >= FLUSH_QUEUED_HASHES:
                await self._flush()
            if self._rewound:  # the rest is replayed from `expected` with the next message
                return
        await self._flush()

    async def _handle_one(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._bad("malformed_frame", f"{len(frames)} frames")
            return
        topic, seq_bytes, payload = frames
        if topic != self._topic and topic:
            self._bad("wrong_topic", f"topic {topic[:80]!r}, expected {self._topic[:80]!r}")
            return
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq < 0:
            self._bad("bad_seq", f"seq {int.from_bytes(seq_bytes, 'big')} (top bit set)")
            return
        expected = self.expected
        if expected is not None and seq < expected:
            log.info("pod %s: seq %d after %d: engine restarted", self.endpoint.pod, seq, expected)
            await self._restart("restart")  # writes queued for the old engine are moot
            expected = None
        buffer = self._limits.replay_buffer_steps
        if expected is None and seq > 0:
            await self._replay(max(0, seq - buffer), seq, late_start=True)
        elif expected is not None and seq > expected:
            if self._metrics:
                self._metrics.seq_gaps.labels(self._pool).inc()
            if seq - expected > buffer:
                self._bad("seq_jump", f"seq {seq} after {expected - 1}: beyond the replay buffer")
                await self._clear_for_gap(expected, seq, "beyond the replay buffer")
            else:
                await self._replay(expected, seq, late_start=False)
        if self._rewound:
            return
        await self._apply_payload(seq, payload)

    async def _replay(self, start: int, stop: int, *, late_start: bool) -> None:
        """Apply batches [start, stop) from the replay socket as they arrive. A mid-stream gap
        (`late_start=False`) that is not replayed completely clears the pod; so does a late
        start's replay that applied some batches but stopped short of `stop` (a removal in
        the batches it missed would leave a stale entry)."""
        await self._flush()
        if self._rewound:
            return
        replay = ReplayRange(
            self._context,
            self.endpoint.replay,
            start,
            stop,
            self._limits,
            from_first_buffered=late_start,
        )
        async with contextlib.aclosing(replay.frames()) as frames:
            async for seq, payload in frames:
                await self._apply_payload(seq, payload)
                if self._batches >= self._drain or self._hashes >= FLUSH_QUEUED_HASHES:
                    await self._flush()
                    if self._rewound:
                        return
        if self._metrics:
            self._metrics.replays.labels(self._pool, replay.outcome).inc()
        # A late start takes any suffix of the buffer, but one that runs up to `stop`.
        short = replay.yielded and replay.next_seq != stop if late_start else replay.outcome != "ok"
        if short:
            await self._clear_for_gap(start, stop, f"replay {replay.outcome}: {replay.reason}")

    async def _clear_for_gap(self, start: int, stop: int, why: str) -> None:
        """Clear the pod: events of [start, stop) are lost (a removal among them would leave a
        stale entry). Queued writes are moot; the message at `stop` applies after the clear."""
        self._drop_queued()
        self._log.warning(
            ("gap", self.endpoint.pod),
            "pod %s: seq gap [%d, %d) not replayed (%s): clearing the pod",
            self.endpoint.pod, start, stop, why,
        )  # fmt: skip
        self._count_clear("gap")
        if not await self._clear():
            self._bad("stale_generation", f"generation {self.generation} superseded")

    async def _apply_payload(self, seq: int, payload: bytes) -> None:
        """Decode a batch and queue its writes (flushed by `_flush`), a slice at a time."""
        self.expected = seq + 1
        if self._ops_from is None:
            self._ops_from = seq
        decoder = BatchDecoder(payload, check_token_ids=False)
        try:
            while True:
                batch = decoder.step(DECODE_SLICE_BYTES)
                if batch is not None:
                    break
                await asyncio.sleep(0)  # others' turn between two slices
        except EventDecodeError as exc:
            self._bad(exc.reason, exc.detail)
            return
        for rejected in batch.rejected:
            self._bad(rejected.reason, rejected.detail)
        if unread := batch.unread_events:
            detail = f"{unread} events after {len(batch.rejected)} rejected ones not read"
            self._bad("too_many_rejects", detail, unread)
        if self._metrics:  # engine clock to ours: wall clocks, so lag includes any skew
            lag = time.time() - batch.ts
            if math.isfinite(lag) and lag <= MAX_EVENT_LAG_SECONDS:
                self._series("lag", self._metrics.event_lag).observe(max(0.0, lag))
        self._batches += 1
        for start in range(0, len(batch.events), APPLY_SLICE_EVENTS):
            if start:
                await asyncio.sleep(0)
            self._queue_writes(batch.events[start : start + APPLY_SLICE_EVENTS])
        if batch.lost_removal:  # after the batch's stores: clearing can only under-report
            self._queue_clear("lost_removal")

    def _queue_writes(self, events: Sequence[KVEvent]) -> None:
        """Coalesce events into the queued writes, in order."""
        if self._metrics:
            # One update per event type, not per event (a batch is mostly one type).
            counts: dict[str, int] = {}
            for event in events:
                kind = type(event).__name__
                counts[kind] = counts.get(kind, 0) + 1
            for kind, count in counts.items():
                self._series(kind, self._metrics.events, kind).inc(count)
        ops = self._ops
        mismatched, other_size = 0, 0
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self._queue_clear("all_blocks_cleared")
                continue
            assert isinstance(event, BlockStored | BlockRemoved)
            if not self._groups.accepts(event):
                if not self._groups.is_partial_attention(event):
                    self._bad("other_kv_cache_group", f"group {event.group_idx}")
                continue
            if (
                isinstance(event, BlockStored)
                and self._block_size is not None
                and event.block_size != self._block_size
            ):
                # its hashes chain other blocks than the router's keys: none would ever match
                mismatched += 1
                other_size = event.block_size
                continue
            op = "add" if isinstance(event, BlockStored) else "remove"
            medium = event.medium or DEFAULT_MEDIUM
            if medium not in self._media:
                continue  # a tier the pool's config does not price is no GPU hit

            self._hashes += len(event.block_hashes)
            if ops and ops[-1].op == op and ops[-1].medium == medium:
                ops[-1].hashes.extend(event.block_hashes)
            else:
                ops.append(_Op(op, medium, list(event.block_hashes)))
        if mismatched:  # one count and log check per batch: a misconfigured pool stays so
            detail = (
                f"{other_size}-token blocks; the pool's engine.block_size is {self._block_size}"
            )
            self._bad("block_size_mismatch", detail, mismatched)

    def _series(self, name: str, metric: Any, *labels: str) -> Any:
        """`metric.labels(pool, *labels)`, kept: `labels()` cost more than the update, a few
        times a batch (one batch per engine step: 800-1,600 a second from 16 pods)."""
        found = self._children.get(name)
        if found is None:
            found = self._children[name] = metric.labels(self._pool, *labels)
        return found

    def _queue_clear(self, reason: str) -> None:
        """Queue a clear of the pod: the writes queued before it are moot."""
        self._count_clear(reason)
        self._ops.clear()
        self._hashes = 0
        self._ops.append(_Op("clear", DEFAULT_MEDIUM, []))

    async def _flush(self) -> None:
        """Apply the queued writes in order, at most `WRITE_SLICE_KEYS` keys a call and between
        two yields to the event loop. If the directory fails on the first write, a clear or a removal,
        the seq of the first unapplied batch becomes `expected` again, so the next message
        replays from there; otherwise the pod starts over (a new generation)."""
        ops, first, batches = self._ops, self._ops_from, self._batches
        self._drop_queued()
        pod, gen = self.endpoint.pod, self.generation
        applied = 0  # directory calls that returned
        unyielded_keys = 0
        try:
            for op in ops:
                for start in range(0, max(1, len(op.hashes)), WRITE_SLICE_KEYS):
                    if unyielded_keys >= WRITE_SLICE_KEYS:
                        await asyncio.sleep(0)
                        unyielded_keys = 0
                    keys = directory_keys(op.hashes[start : start + WRITE_SLICE_KEYS])
                    unyielded_keys += max(1, len(keys))
                    accepted = await self._write(op, keys, gen)
                    applied += 1
                    if not accepted:
                        self._bad("stale_generation", f"generation {gen} superseded")
                        break  # the op's other keys would be refused too
        except Exception as exc:
            self._log.warning(("apply", pod),
                              "pod %s: directory write failed (%s); will replay from seq %s",
                              pod, exc, first)  # fmt: skip
            if self._metrics:
                self._metrics.bad_events.labels(self._pool, "directory_error").inc()
            await asyncio.sleep(self._retry)
            if applied or ops[0].op == "add":
                # Replaying would apply the writes that landed twice, and a store that failed
                # may have landed all the same (a timeout after Redis ran it): a store applied
                # twice is a copy the engine never made. Start the pod over, as after any
                # error (`run`). A failed first clear or removal is replayed: twice is harmless.
                await self._restart("error")
                self._rewound = True
            elif first is not None:
                self.expected = first
                self._rewound = True
            return
        if self._metrics and batches:
            self._series("batches", self._metrics.event_batches).inc(batches)

    async def _write(self, op: _Op, keys: list[BlockKey], generation: str) -> bool:
        """One directory call of `op` (its `keys`, or a clear); False if it was refused: the
        pod's generation in the directory is no longer `generation`."""
        pod = self.endpoint.pod
        if op.op == "clear":
            return await self._clear()
        write = self._index.add if op.op == "add" else self._index.remove
        return await write(pod, keys, medium=op.medium, generation=generation)

    async def _clear(self) -> bool:
        """Clear the pod where this subscription's generation is the pod's; False if another
        subscription owns it now (a newer generation, e.g. the next indexer in a rolling
        update, or the router replica that started last): its adds are refused, and its clears
        would wipe the owner's entries. A router replica's local view is cleared all the same
        (it is what the replica rebuilds the shared directory from if it takes the pod over)."""
        pod = self.endpoint.pod
        await self._index.clear_pod(pod, generation=self.generation)
        return await self._index.get_generation(pod) == self.generation

    async def _restart(self, reason: str) -> None:
        """Forget everything known about the pod: new generation, no expected seq."""
        self._drop_queued()
        self._restarts += 1
        self.generation = self._next_generation()
        self.expected = None
        await self._new_generation(reason)

    def _drop_queued(self) -> None:
        self._ops, self._ops_from, self._batches, self._hashes = [], None, 0, 0

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

    def _bad(self, reason: str, detail: str, count: int = 1) -> None:
        if self._metrics:
            self._series(f"bad:{reason}", self._metrics.bad_events, reason).inc(count)
        self._log.warning((reason, self.endpoint.pod), "pod %s: skipped (%s): %s",
                          self.endpoint.pod, reason, detail)  # fmt: skip
