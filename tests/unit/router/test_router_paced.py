"""`paced`, the bound on how long the router waits for a pod's next chunk: one timer per body
that counts only the time spent waiting for the pod, fails a stalled or endless body with
UpstreamError("timeout"), and leaves any other cancellation alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

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


async def test_a_body_that_keeps_coming_passes_whole() -> None:
    got = await _collect(paced(_source([0.01] * 20), 0.2))
    assert got == [b"chunk %d" % i for i in range(20)]


async def test_a_pod_that_stalls_is_a_timeout_after_the_gap() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(UpstreamError, match=r"nothing from the pod for 0\.2 s") as err:
        await _collect(paced(_source([0.0, 0.05], stall=True), 0.2))
    assert err.value.kind == "timeout"
    assert 0.2 <= loop.time() - started < 0.6
    assert asyncio.current_task().cancelling() == 0  # the timer's cancellation was taken back


async def test_the_callers_own_time_does_not_count_towards_the_gap() -> None:
    # each chunk comes at once, but the caller takes 0.15 s over each: 0.6 s in all with a gap
    # of 0.1 s, and no timeout
    got = await _collect(paced(_source([0.0] * 4), 0.1), pause=0.15)
    assert len(got) == 4


async def test_a_pod_that_drips_is_cut_at_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    until = started + 0.3
    with pytest.raises(UpstreamError, match="did not end in time"):
        await _collect(paced(_source([0.05] * 100), 0.2, until=until))
    assert 0.3 <= loop.time() - started < 0.6
    # past the deadline, the next wait is refused at once
    with pytest.raises(UpstreamError, match="did not end in time"):
        await _collect(paced(_source([0.0]), 0.2, until=loop.time() - 1))


async def test_another_cancellation_is_not_turned_into_a_timeout() -> None:
    reader = asyncio.create_task(_collect(paced(_source([0.0], stall=True), 0.2)))
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    # cancelled while the timer fires: the caller's cancellation wins too
    reader = asyncio.create_task(_collect(paced(_source([0.0], stall=True), 0.1)))
    await asyncio.sleep(0.1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_no_timer_outlives_its_body() -> None:
    loop = asyncio.get_running_loop()
    chunks = paced(_source([0.0] * 3), 0.05)
    assert await anext(chunks) == b"chunk 0"
    await chunks.aclose()  # the caller stops early
    await asyncio.sleep(0.2)  # a timer left behind would fire (and reschedule itself) here
    assert not [h for h in getattr(loop, "_scheduled", []) if not h.cancelled()]
