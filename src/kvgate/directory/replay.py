"""Read one range of batches from a vLLM pod's replay socket, within a deadline and bounds.

vLLM's replay socket is a ROUTER: a DEALER sends `["", start_seq]` and receives
`["", topic, seq, payload]` (vLLM >= 0.11; older releases omit the topic) for every buffered
batch with seq >= start, in order, then an end marker whose seq is -1.

`ReplayRange(start, stop).frames()` yields the batches of [start, stop) as they arrive, so a
replay costs the memory of one frame, not of the range. It stops, and says why in `outcome`:

* `ok`: every seq of [start, stop) arrived, consecutively (the socket is closed at once, without
  waiting for the end marker or the batches after `stop` the pod also sends);
* `partial` / `failed` (something / nothing was yielded): the end marker came first, a seq was
  skipped, a frame was malformed, `replay_timeout_seconds` passed since the request (the
  caller's time between frames counts too: a slow trickle or a socket that never ends is cut
  off), more than `replay_buffer_steps` frames or `replay_max_bytes` payload bytes arrived, or
  there is no replay endpoint. Each frame is at most `max_message_bytes` (ZMQ_MAXMSGSIZE: a
  larger one drops the connection, and the deadline ends the replay).

With `from_first_buffered` the first yielded seq may be later than `start` (a subscriber that
starts late takes whatever suffix the pod's buffer still holds); otherwise the first frame
must be `start` itself, since applying later batches over a hole could keep a removed block.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

import zmq
import zmq.asyncio

from kvgate.api.router_config import KvEventsConfig

END_SEQ = -1


class ReplayRange:
    """One replay request for the batches [start, stop); iterate `frames()` once."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        endpoint: str | None,
        start: int,
        stop: int,
        limits: KvEventsConfig,
        *,
        from_first_buffered: bool = False,
    ) -> None:
        self._context = context
        self._endpoint = endpoint
        self.start = start
        self.stop = stop
        self._limits = limits
        self._from_first = from_first_buffered
        self.first_seq: int | None = None  # the first yielded seq
        self.next_seq: int | None = None  # after the last yielded seq
        self.outcome = "failed"
        self.reason = "no replay endpoint"

    @property
    def yielded(self) -> bool:
        return self.next_seq is not None

    async def frames(self) -> AsyncGenerator[tuple[int, bytes], None]:
        if not self._endpoint or self.start >= self.stop:
            if self.start >= self.stop:
                self.outcome, self.reason = "ok", "empty range"
            return
        limits = self._limits
        timeout = limits.replay_timeout_seconds
        deadline = time.monotonic() + timeout
        # A buffer of `replay_buffer_steps` batches never sends more frames than that.
        max_frames, max_bytes = limits.replay_buffer_steps, limits.replay_max_bytes
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        sock.connect(self._endpoint)
        frames_seen = bytes_seen = 0
        try:
            await sock.send_multipart([b"", self.start.to_bytes(8, "big")])
            while True:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not await sock.poll(left_ms):
                    self._end(f"not complete within {timeout:g} s")
                    return
                parts = await sock.recv_multipart()
                frames_seen += 1
                if parts and parts[0] == b"":
                    parts = parts[1:]
                if len(parts) == 3:  # vLLM >= 0.11 sends the topic too
                    parts = parts[1:]
                if len(parts) != 2 or len(parts[0]) != 8:
                    self._end("malformed replay frame")
                    return
                seq = int.from_bytes(parts[0], "big", signed=True)
                if seq == END_SEQ:
                    self._end("the pod's buffer ended first")
                    return
                bytes_seen += len(parts[1])
                if frames_seen > max_frames or bytes_seen > max_bytes:
                    self._end(f"over {max_frames} frames or {max_bytes} bytes")
                    return
                want = self.next_seq if self.next_seq is not None else self.start
                if seq < want:
                    continue  # already had it (a pod may resend the start of its buffer)
                if seq > want and not (self.next_seq is None and self._from_first):
                    self._end(f"seq {seq} where {want} was due")
                    return
                if seq >= self.stop:
                    self._end("the pod's buffer ended first")
                    return
                if self.first_seq is None:
                    self.first_seq = seq
                self.next_seq = seq + 1
                yield seq, parts[1]
                if self.next_seq == self.stop:
                    complete = self.first_seq == self.start
                    self.outcome = "ok" if complete else "partial"
                    self.reason = "complete" if complete else "older batches were gone"
                    return
        finally:
            sock.close(linger=0)

    def _end(self, reason: str) -> None:
        self.outcome = "partial" if self.yielded else "failed"
        self.reason = reason
