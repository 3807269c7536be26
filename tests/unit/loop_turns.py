"""How often another task ran while some work was awaited: for the tests that long work (a big
write, a big payload) lets the event loop run other tasks between its steps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable


@contextlib.asynccontextmanager
async def other_task_turns() -> AsyncIterator[Callable[[], int]]:
    """`async with other_task_turns() as turns:` ... `turns()` is how many times a task that
    only yields ran since the block began."""
    count = 0

    async def spin() -> None:
        nonlocal count
        while True:
            count += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    await asyncio.sleep(0)  # its first turn, before the work
    start = count
    try:
        yield lambda: count - start
    finally:
        task.cancel()
