"""`paced`, the bound on how long the router waits for a pod's next chunk: one timer per body
that counts only the time spent waiting for the pod, fails a stalled or endless body with
UpstreamError("timeout"), and leaves any other cancellation alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import uvloop

from kvgate.router.http.upstream import UpstreamError, paced


async def _source(delays: list[float], stall: bool = False) -> AsyncIterator[bytes]:
    """A pod: each chunk after its delay, then the end (or a stall forever)."""
    for i, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield b"chunk %d" % i
    if stall:
        await asyncio.Event().wait()


async def _collect(chunks: AsyncIterator[bytes], pause: float = 0.0) -> list[bytes]:
    got = []
    async for chunk in chunks:
        got.append(chunk)
        await asyncio.sleep(pause)  # the caller's own time with a chunk (sending it on)
    return got


def _current_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def test_a_body_that_keeps_coming_passes_whole() -> None:
    got = await _collect(paced(_source([0.01] * 20), 1.0))
    assert got == [b"chunk %d" % i for i in range(20)]


async def test_a_pod_that_stalls_is_a_timeout_after_the_gap() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(UpstreamError, match=r"nothing from the pod for 0\.5 s") as err:
        await _collect(paced(_source([0.0, 0.05], stall=True), 0.5))
    assert err.value.kind == "timeout"
    assert 0.5 <= loop.time() - started < 2.0
    assert _current_task().cancelling() == 0  # the timer's cancellation was taken back


async def test_the_callers_own_time_does_not_count_towards_the_gap() -> None:
    # each chunk comes at once, but the caller takes 0.6 s over each: 1.8 s in all against a
    # gap of 0.5 s, and no timeout
    got = await _collect(paced(_source([0.0] * 3), 0.5), pause=0.6)
    assert len(got) == 3


async def test_a_pod_that_drips_is_cut_at_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    until = started + 0.5
    with pytest.raises(UpstreamError, match="did not end in time"):
        await _collect(paced(_source([0.05] * 100), 1.0, until=until))
    assert 0.5 <= loop.time() - started < 2.0
    # past the deadline, the next wait is refused at once
    with pytest.raises(UpstreamError, match="did not end in time"):
        await _collect(paced(_source([0.0]), 1.0, until=loop.time() - 1))


def test_a_fast_pod_cut_at_the_deadline_under_uvloop() -> None:
    """uvloop rounds timers to the millisecond and hands back a plain Handle for one due within
    half a millisecond: chunks coming without a pause up to the deadline meet both."""

    async def fast() -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(0)
            yield b"x"

    async def run() -> None:
        for ms in (20.2, 50.2, 30.7):
            loop = asyncio.get_running_loop()
            with pytest.raises(UpstreamError, match="did not end in time"):
                await _collect(paced(fast(), 5.0, until=loop.time() + ms / 1000))
            assert _current_task().cancelling() == 0

    uvloop.run(run())


async def test_another_cancellation_is_not_turned_into_a_timeout() -> None:
    reader = asyncio.create_task(_collect(paced(_source([0.0], stall=True), 0.5)))
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    # cancelled as the timer fires: the caller's cancellation wins too
    reader = asyncio.create_task(_collect(paced(_source([0.0], stall=True), 0.2)))
    await asyncio.sleep(0.2)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_a_source_that_swallows_the_cancellation_still_times_out() -> None:
    async def stubborn() -> AsyncIterator[bytes]:
        yield b"first"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            yield b"late"  # a source that goes on regardless

    with pytest.raises(UpstreamError, match="nothing from the pod"):
        await _collect(paced(stubborn(), 0.3))
    assert _current_task().cancelling() == 0

    async def converting() -> AsyncIterator[bytes]:
        yield b"first"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("the source's own error") from None

    with pytest.raises(RuntimeError):
        await _collect(paced(converting(), 0.3))
    assert _current_task().cancelling() == 0


async def test_no_timer_outlives_its_body() -> None:
    loop = asyncio.get_running_loop()
    assert hasattr(loop, "_scheduled")  # asyncio's own loop, whose timers can be listed
    chunks = paced(_source([0.0] * 3), 0.05)
    assert await anext(chunks) == b"chunk 0"
    await chunks.aclose()  # the caller stops early
    await asyncio.sleep(0.2)  # a timer left behind would fire (and re-arm itself) here
    assert not [h for h in loop._scheduled if not h.cancelled()]
