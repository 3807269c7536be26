"""What the exchanges with the other router replicas share: one Redis client and one loop.

`SharedRedis` is the router's one client to the directory's Redis for these exchanges (the
load exchange, `load_sharing.py`, and shared warm-ups, `warm_sharing.py`): made on first use
from `directory.redis` (URL secret, TLS CA, cluster; socket timeout
`socket_timeout_seconds`), made anew when a reload changes that section, and closed by its
owner (the runtime, after the exchanges stopped). Each exchange bounds its own calls with
`asyncio.timeout` (the load exchange by `load_sharing.timeout_seconds`, warm-up calls by the
directory's socket timeout), so one client serves both.

`ReplicaExchange` is the task each exchange runs, owned: `start()` creates it, `stop()`
cancels and awaits it. Each round it reads the config: while the exchange is off it calls
`idle()` and looks again a second later; while on it runs `step()` (False: a call to Redis
failed), then waits `delay()`, or, after failures, backs off (doubling from `interval()`) to
one round a second. `wake()` starts the next round at once. A round that raises (a bug) is
logged, with its traceback once per run of failures, and retried after the back-off: nothing
ends the task before `stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from kvgate.api.router_config import RedisConfig, RouterConfig
from kvgate.directory.factory import redis_connection
from kvgate.directory.redis import Client
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.metrics import RouterMetrics
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

IDLE_CHECK_SECONDS = 1.0  # how often an exchange that is off looks at its config again
MAX_BACKOFF_SECONDS = 1.0


def replica_id() -> str:
    """This process among the replicas: the pod's hostname, the pid and a random suffix."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{secrets.token_hex(3)}"


class SharedRedis:
    """The replica exchanges' client to the directory's Redis (see the module docstring)."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._made_for: RedisConfig | None = None

    @property
    def current(self) -> Client | None:
        """The client made last (None: none yet, or closed)."""
        return self._client

    async def client(self, config: RedisConfig) -> Client:
        """The client for `config`; the one made before if `config` has not changed since.
        Raises ValueError if a secret or CA bundle cannot be read, or the URL is wrong."""
        if self._client is not None and self._made_for != config:  # reloaded
            await self.aclose()
        if self._client is None:
            self._client = redis_connection(config).client(config.socket_timeout_seconds)
            self._made_for = config
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class ReplicaExchange(ABC):
    """An owned background exchange with the other replicas (see the module docstring)."""

    name: ClassVar[str]  # for the logs: "load sharing on"
    task_name: ClassVar[str]

    def __init__(
        self,
        core: RoutingCore,
        config: Callable[[], RouterConfig],
        metrics: RouterMetrics,
        *,
        redis: SharedRedis | None = None,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`redis`: the router's shared client (its owner closes it); None: one of its own,
        closed by `stop()`."""
        self.core = core
        self._config = config
        self.metrics = metrics
        self.redis = redis if redis is not None else SharedRedis()
        self._owns_redis = redis is None
        self.replica = replica or replica_id()
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._enabled = False
        self._failures = 0  # rounds in a row that failed

    # -- what each exchange does -------------------------------------------------------------

    @abstractmethod
    def enabled(self, config: RouterConfig) -> bool:
        """Whether the exchange is on under `config`."""

    @abstractmethod
    async def step(self, config: RouterConfig) -> bool:
        """One round; False if any call to Redis failed (the next round backs off)."""

    @abstractmethod
    def interval(self, config: RouterConfig) -> float:
        """The shortest wait between rounds; the back-off doubles from it."""

    def delay(self, config: RouterConfig) -> float:
        """The wait after a round that succeeded."""
        return self.interval(config)

    @abstractmethod
    def idle(self) -> None:
        """A round while the exchange is off."""

    def step_raised(self) -> None:
        """`step` raised (a bug): undo what it may have left half done (nothing, by default)."""
        return None

    # -- the task ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.task_name)

    def wake(self) -> None:
        """Run the next round now rather than after the wait."""
        self._wake.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._owns_redis:
            await self.redis.aclose()

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # a wake() while this round runs wakes the next one
            try:
                delay = await self._round()
            except Exception:  # a bug must not end the exchange for the process's life
                self._log_failure("round")
                self._failures += 1
                delay = MAX_BACKOFF_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _round(self) -> float:
        config = self._config()
        enabled = self.enabled(config)
        if enabled != self._enabled:  # on at start, or a reload turned it on or off
            log.info("%s %s", self.name, "on" if enabled else "off")
            self._enabled = enabled
        if not enabled:
            self._failures = 0
            self.idle()
            return IDLE_CHECK_SECONDS
        try:
            ok = await self.step(config)
        except Exception:
            self._log_failure("step")
            self.step_raised()
            ok = False
        if ok:
            if self._failures:
                log.info("%s: Redis answers again", self.name)
            self._failures = 0
            return self.delay(config)
        self._failures += 1
        return min(MAX_BACKOFF_SECONDS, self.interval(config) * 2.0**self._failures)

    def _log_failure(self, what: str) -> None:
        """An unexpected exception: its traceback once per run of failed rounds."""
        if self._failures == 0:
            log.exception("%s: %s failed (retried, backing off)", self.name, what)
        else:
            log.debug("%s: %s failed again", self.name, what, exc_info=True)
