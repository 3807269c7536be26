"""kvgate.tasks.cancel_and_wait: what it swallows, what it raises, and that it waits."""

from __future__ import annotations

import asyncio

import pytest

from kvgate.tasks import cancel_and_wait


async def _run_until_cancelled(cleaned_up: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(0)  # the cleanup takes a turn of the loop
        cleaned_up.append(name)


async def _started(coro) -> asyncio.Task:
    task = asyncio.create_task(coro)
    await asyncio.sleep(0)
    return task


async def test_cancels_every_task_and_waits_for_its_cleanup() -> None:
    cleaned_up: list[str] = []
    first = await _started(_run_until_cancelled(cleaned_up, "first"))
    second = await _started(_run_until_cancelled(cleaned_up, "second"))

    await cancel_and_wait(first, second)

    assert first.cancelled() and second.cancelled()
    assert sorted(cleaned_up) == ["first", "second"]


async def test_none_is_skipped() -> None:
    cleaned_up: list[str] = []
    task = await _started(_run_until_cancelled(cleaned_up, "task"))

    await cancel_and_wait(None, task, None)
    await cancel_and_wait()

    assert task.cancelled() and cleaned_up == ["task"]


async def test_another_exception_a_task_ends_with_is_raised() -> None:
    async def fail_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = await _started(fail_when_cancelled())

    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    cleaned_up: list[str] = []
    task = await _started(_run_until_cancelled(cleaned_up, "task"))
    stopper = await _started(cancel_and_wait(task))  # now waiting for the task's cleanup

    stopper.cancel()

    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task.cancelled() and cleaned_up == ["task"]


async def test_a_caller_cleaning_up_after_its_own_cancellation_gets_through_its_cleanup() -> None:
    cleaned_up: list[str] = []
    task = await _started(_run_until_cancelled(cleaned_up, "task"))

    async def serve() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(task)
            cleaned_up.append("caller")

    caller = await _started(serve())
    caller.cancel()

    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cleaned_up == ["task", "caller"]
