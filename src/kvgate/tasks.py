"""Stopping background asyncio tasks: cancel them, then wait until they have finished."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every task given (None is skipped), then wait for each to finish.

    A task's own cancellation is swallowed; any other exception it ended with is raised. If the
    caller is cancelled while it waits, its CancelledError is raised (once the awaited task is done).
    """
    stopping = [task for task in tasks if task is not None]
    for task in stopping:
        task.cancel()
    caller = asyncio.current_task()
    assert caller is not None
    for task in stopping:
        cancels_before = caller.cancelling()
        try:
            await task
        except asyncio.CancelledError:
            # Against the count before the wait, not zero: a caller cleaning up after its own
            # cancellation (in a `finally`) must still get through the rest of its cleanup.
            if caller.cancelling() > cancels_before:
                raise
