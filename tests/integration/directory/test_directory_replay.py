"""`ReplayRange` against a real ZMQ ROUTER that answers with a scripted sequence of frames: what
it yields, and why it stops (complete, the buffer moved on, a skipped seq, malformed frames, the
frame and byte bounds, the deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from kvgate.api.router_config import KvEventsConfig
from kvgate.directory.replay import ReplayRange

END = object()  # the end marker, seq -1


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def run(
    ctx: zmq.asyncio.Context,
    script: list[object],
    start: int,
    stop: int,
    *,
    late: bool = False,
    **limits: float,
) -> tuple[list[int], ReplayRange]:
    """Serve `script` (seqs, END, or raw frame lists) to one replay request; collect it."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    async def serve() -> None:
        ident, _, first = await router.recv_multipart()
        assert int.from_bytes(first, "big") == start
        for item in script:
            if item is END:
                frames = [b"", (-1).to_bytes(8, "big", signed=True), b""]
            elif isinstance(item, int):
                frames = [b"t", item.to_bytes(8, "big"), b"x" * 100]
            else:
                frames = item  # type: ignore[assignment]
            await router.send_multipart([ident, b"", *frames])
        await asyncio.sleep(30)  # then silence

    server = asyncio.create_task(serve())
    replay = ReplayRange(
        ctx,
        f"tcp://127.0.0.1:{port}",
        start,
        stop,
        KvEventsConfig(**{"replay_timeout_seconds": 2.0, **limits}),
        from_first_buffered=late,
    )
    try:
        got = [seq async for seq, _payload in replay.frames()]
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        router.close(0)
    return got, replay


@pytest.mark.parametrize(
    ("script", "start", "stop", "late", "want", "outcome"),
    [
        ([5, 6, 7, 8, 9, END], 5, 8, False, [5, 6, 7], "ok"),  # stops at stop, no end needed
        ([3, 4, 5, 6, 7], 5, 8, False, [5, 6, 7], "ok"),  # older batches are skipped
        ([6, 7, END], 5, 8, False, [], "failed"),  # the buffer moved on past `start`
        ([6, 7, END], 0, 8, True, [6, 7], "partial"),  # late start: take the suffix
        ([5, 7, END], 5, 8, False, [5], "partial"),  # a skipped seq
        ([5, END], 5, 8, False, [5], "partial"),  # the end marker first
        ([5, [b"t", b"\x01", b""]], 5, 8, False, [5], "partial"),  # a malformed frame
        ([9, END], 5, 8, True, [], "failed"),  # nothing of the range is left
    ],
)
async def test_scripted_replays(
    ctx: zmq.asyncio.Context,
    script: list[object],
    start: int,
    stop: int,
    late: bool,
    want: list[int],
    outcome: str,
) -> None:
    got, replay = await run(ctx, script, start, stop, late=late)
    assert (got, replay.outcome) == (want, outcome), replay.reason


async def test_frames_beyond_the_buffer_size_end_the_replay(ctx: zmq.asyncio.Context) -> None:
    got, replay = await run(ctx, [0] * 50 + [5, 6], 5, 7, replay_buffer_steps=10)
    assert (got, replay.outcome) == ([], "failed")
    assert "frames" in replay.reason


async def test_bytes_beyond_the_bound_end_the_replay(ctx: zmq.asyncio.Context) -> None:
    got, replay = await run(ctx, [5, 6, 7, 8], 5, 9, replay_max_bytes=250)  # 100 B each
    assert (got, replay.outcome) == ([5, 6], "partial")


async def test_a_silent_socket_is_given_up_at_the_deadline(ctx: zmq.asyncio.Context) -> None:
    started = time.monotonic()
    got, replay = await run(ctx, [5], 5, 9, replay_timeout_seconds=0.3)
    elapsed = time.monotonic() - started
    assert (got, replay.outcome) == ([5], "partial")
    assert 0.25 <= elapsed < 1.5


async def test_an_oversized_frame_drops_the_connection(ctx: zmq.asyncio.Context) -> None:
    big = [b"t", (5).to_bytes(8, "big"), b"x" * 4096]
    got, replay = await run(ctx, [big, 6], 5, 7, max_message_bytes=1024, replay_timeout_seconds=0.3)
    assert (got, replay.outcome) == ([], "failed")


async def test_an_empty_range_or_no_endpoint_needs_no_socket(ctx: zmq.asyncio.Context) -> None:
    empty = ReplayRange(ctx, "tcp://127.0.0.1:1", 5, 5, KvEventsConfig())
    assert [x async for x in empty.frames()] == [] and empty.outcome == "ok"
    none = ReplayRange(ctx, None, 0, 5, KvEventsConfig())
    assert [x async for x in none.frames()] == [] and none.outcome == "failed"
