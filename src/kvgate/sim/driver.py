"""Runs a :class:`SimEngine` against the wall clock for the HTTP server.

Virtual time is ``(monotonic() - t0) / time_scale``. Arrivals are stamped with the virtual time
at which they reach the driver. The loop follows the engine's stepping rule (see
:mod:`kvgate.sim.engine`): it starts a step at ``engine.next_step_time(previous end)``, sleeps
until the step's end in wall time, then hands each request its new token. When the process falls
behind (a busy CPU), steps run back to back without sleeping and virtual results are unchanged:
TTFTs reported in virtual time are the same as the discrete-event mode's for the same arrivals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kvgate.prefix.cache_ops import OpHistory
from kvgate.sim.engine import SimEngine, StepResult
from kvgate.sim.lora import LoraModule
from kvgate.sim.request import SimRequest
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class RequestStream:
    """Tokens of one request as the engine produces them."""

    __slots__ = ("_waiter", "done", "request", "tokens")

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self.tokens: list[int] = []
        self.done = False
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, have: int) -> None:
        """Return once more than ``have`` tokens exist or the request is done."""
        while len(self.tokens) <= have and not self.done:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None


StepListener = Callable[[StepResult], None]


class EngineDriver:
    def __init__(
        self,
        engine: SimEngine,
        time_scale: float = 1.0,
        on_step: StepListener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self._on_step = on_step
        self._clock = clock
        self._t0 = clock()
        self._last_end = 0.0
        self._streams: dict[SimRequest, RequestStream] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """Current virtual time (seconds since the driver started)."""
        return (self._clock() - self._t0) / self.time_scale

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        lora: LoraModule | None = None,
        history: OpHistory | None = None,
    ) -> RequestStream:
        """Queue a request (raises ``RequestRejected`` for requests vLLM refuses)."""
        req = self.engine.add_request(
            request_id,
            prompt_token_ids,
            max_tokens,
            self.now(),
            cache_salt=cache_salt,
            lora=lora,
            history=history,
        )
        stream = RequestStream(req)
        self._streams[req] = stream
        self._wakeup.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        if not stream.done:
            self.engine.abort(stream.request)
            self._streams.pop(stream.request, None)
            stream.done = True
            stream._wake()

    def restart(self) -> None:
        """Simulate an engine restart: drop all requests and state."""
        for req in self.engine.restart():
            stream = self._streams.pop(req, None)
            if stream is not None:
                stream.done = True
                stream._wake()
        self._wakeup.set()

    async def _sleep_until(self, virtual: float) -> None:
        delay = (virtual - self.now()) * self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    async def _run(self) -> None:
        engine = self.engine
        while True:
            start = engine.next_step_time(self._last_end)
            if start is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._sleep_until(start)
            result = engine.step(start)
            self._last_end = result.end
            await self._sleep_until(result.end)
            streams = self._streams
            for req, token in result.tokens:
                stream = streams.get(req)
                if stream is not None:
                    stream.tokens.append(token)
                    stream._wake()
            for req in result.finished:
                stream = streams.pop(req, None)
                if stream is not None:
                    stream.done = True
                    stream._wake()
            if self._on_step is not None:
                try:
                    self._on_step(result)
                except Exception:  # a listener must never stop the engine
                    log.exception("step listener failed")
            if not result.tokens and not result.finished and not engine.num_running:
                # Nothing could be scheduled (waiting for a later arrival): yield to the loop.
                await asyncio.sleep(0)
