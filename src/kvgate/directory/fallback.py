"""A shared (Redis) directory with a local fallback: losing Redis never fails a request, and a
Redis blip never loses cache hits for good.

`FallbackIndex` applies every write to a local in-memory index first, then to the shared one;
lookups go to the shared index (which also holds what other routers and `kvgate indexer` wrote).

* **A lost write** marks its pod *unsynced*: the shared index may now miss blocks the engine
  holds, or keep blocks it dropped. Later writes to an unsynced pod skip the shared index (the
  local view keeps them), and lookups answer for unsynced pods from the local view. A lost write
  does not degrade lookups for the other pods.
* **Lookups** that fail are answered from the local view; after `failures_to_degrade` failed
  reads in a row the index is *degraded*: reads use the local view without asking Redis, and
  writes skip it too (each pod written is marked unsynced), so that a dead Redis costs no
  timeout per request. Counted in `kvgate_directory_fallback_errors_total{operation}` and
  `kvgate_directory_fallback_degraded`.
* **Resync**: at most every `resync_interval` after a failure, a background task (owned here,
  cancelled by `close`) probes the shared index (`audit`: if its epoch changed, a Redis that
  restarted empty or was replaced, every pod the local view holds is unsynced; else the pods it
  lacks; the epoch is first read before the first shared write), then rebuilds each unsynced
  pod there from the local view (the probe also runs every
  `audit_interval`, since a Redis that restarts between two calls raises nothing: the client
  reconnects, and the next write re-creates its pod with that write's entries only):
  a `forget_pod` that was lost is replayed; then the pod's local generation is set, the pod is
  cleared (only by a writer of its exact entries: a router that wrote only routing history
  beside an indexer re-adds that, and leaves the indexer's entries alone), and its exact entries (per medium) and unexpired approximate entries (with their
  remaining TTL) are written in batches. The snapshot is taken in one step; writes to the pod
  that arrive while it is copied are queued and replayed after it, in order (a bounded queue;
  overflowing it means another rebuild). A degraded index first probes the shared one and, once
  it answers, sends lookups there again (unsynced pods keep being answered locally until their
  rebuild is done).

So after an outage the shared directory again says what the engines hold, instead of having
forgotten it: blocks that stay cached in an engine are not announced again by its KV events.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from kvgate.directory.base import DEFAULT_MEDIUM, BlockIndex, IndexStats
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.prefix.hashing import BlockKey
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_Call = Callable[[BlockIndex], Awaitable[Any]]


@dataclass(slots=True)
class _Suspect:
    """A pod whose writes the shared index refused (`FallbackIndex._refused`)."""

    generation: str  # ours
    since: float | None  # the first refused write not asked about yet
    quiet_until: float = -math.inf  # its owner was found alive: no question before


_FAILED = object()


class FallbackIndex:
    def __init__(
        self,
        shared: BlockIndex,
        local: MemoryBlockIndex,
        errors: Counter,
        degraded: Gauge,
        *,
        resync_interval: float = 1.0,
        failures_to_degrade: int = 3,
        audit_interval: float = 30.0,
        rebuild_batch: int = 4096,
        max_queued_writes: int = 10_000,
        owner_silence_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.local = local
        self._errors = errors  # labelled by operation
        self._degraded = degraded
        self._interval = resync_interval
        self._clock = clock
        self.degraded = False
        self.failures_to_degrade = failures_to_degrade
        self._batch = rebuild_batch
        self._max_queued = max_queued_writes
        self._read_failures = 0
        self._retry_at = 0.0
        self._audit_interval = audit_interval
        self._next_audit = clock() + audit_interval
        self._unsynced: set[str] = set()  # pods whose shared entries missed writes
        self._epoch: str | None = None  # the shared index's, at the last probe
        self._forgotten: set[str] = set()  # of those, pods whose lost write was a forget_pod
        # Pods being rebuilt -> shared writes that arrived meanwhile (None: too many, rebuild
        # again). A pod is in at most one of _unsynced and _rebuilding.
        self._rebuilding: dict[str, deque[_Call] | None] = {}
        self._inflight: dict[str, int] = {}  # pod -> shared writes awaiting an answer
        self._suspects: dict[str, _Suspect] = {}  # pods whose owner may have stopped
        self._owner_silence = owner_silence_seconds
        self._owner_margin = owner_silence_seconds / 4  # an owner writes the same event sooner
        self._next_owner_check = math.inf
        self.owner_task: asyncio.Task[None] | None = None
        self.resync_task: asyncio.Task[bool] | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def unsynced(self) -> set[str]:
        """Pods whose shared entries do not match the local view yet (being rebuilt or not)."""
        return self._unsynced | set(self._rebuilding)

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._errors.labels(operation).inc()
        if not self._unsynced and not self.degraded:
            log.warning("shared directory failed (%s: %r); using the local view", operation, exc)
        self._retry_at = self._clock() + self._interval

    def _read_failed(self, operation: str, exc: BaseException) -> None:
        self._failed(operation, exc)
        self._read_failures += 1
        if not self.degraded and self._read_failures >= self.failures_to_degrade:
            log.warning("shared directory unreachable; routing on the local view")
            self.degraded = True
            self._degraded.set(1)

    def _lost(self, pod: str, operation: str) -> None:
        self._unsynced.add(pod)
        if operation == "forget_pod":
            self._forgotten.add(pod)

    def _maybe_resync(self) -> None:
        now = self._clock()
        if self.owner_task is None and now >= self._next_owner_check:
            self.owner_task = asyncio.create_task(
                self._check_owners(), name="kvgate-directory-owners"
            )
        if self.resync_task is not None:
            return
        failed = (self.degraded or bool(self._unsynced)) and now >= self._retry_at
        if not failed and now < self._next_audit:
            return
        self._next_audit = now + self._audit_interval
        self.resync_task = asyncio.create_task(self._resync_task(), name="kvgate-directory-resync")

    async def _resync_task(self) -> bool:
        try:
            return await self.resync()
        finally:
            self.resync_task = None

    # -- resync ------------------------------------------------------------------------------

    async def resync(self) -> bool:
        """Leave the degraded state if the shared index answers, then rebuild each unsynced pod
        there (see the module docstring). False (retried later) if the shared index fails."""
        try:
            # The probe. A Redis that restarted empty (or failed over to a replica that missed
            # writes) lost what the local view holds: every pod, if its epoch changed (a write
            # since then re-created its pod with that write's entries only), else the pods it
            # lacks. Those are unsynced too.
            local_pods = await self.local.pods()
            epoch, missing = await self.shared.audit(local_pods)
            if self._epoch is not None and epoch != self._epoch:
                log.warning("shared directory lost its data (restarted or replaced): rebuilding")
                missing = local_pods
            self._epoch = epoch
            self._unsynced |= missing - set(self._rebuilding)
            if self.degraded:
                self.degraded = False
                self._degraded.set(0)
                self._read_failures = 0
                log.info("shared directory is back; rebuilding %d pod(s)", len(self._unsynced))
            for pod in sorted(self._unsynced):
                if pod not in self._unsynced or pod in self._rebuilding:
                    continue  # another resync (a direct call) took it meanwhile
                if self._inflight.get(pod):
                    # A shared write to the pod that started before it was marked unsynced is
                    # still in flight (a slow Redis): landing after the rebuild it could undo
                    # it. Rebuild the pod shortly, once that write has its answer.
                    self._retry_at = self._clock() + min(self._interval, 0.05)
                    continue
                await self._rebuild(pod)
        except Exception as exc:
            self._failed("resync", exc)
            return False
        return not self._unsynced

    async def _rebuild(self, pod: str) -> None:
        forget = pod in self._forgotten
        self._unsynced.discard(pod)
        self._forgotten.discard(pod)
        snapshot = self.local.export_pod(pod)  # no await since the discard: consistent
        queue: deque[_Call] | None = deque()
        self._rebuilding[pod] = queue
        shared = self.shared
        try:
            if forget:
                await shared.forget_pod(pod)
            if snapshot is None:
                if not forget:
                    await shared.clear_pod(pod)
            else:
                generation = snapshot.generation
                fresh = generation is not None and await shared.set_generation(pod, generation)
                if not fresh and (generation is not None or snapshot.exact):
                    # The pod's exact entries are this writer's: rewrite them whole (a new
                    # generation starts empty). A writer of routing history alone (a router
                    # beside an indexer) only adds it again: its clear wiped the indexer's
                    # exact entries for good. Only while the generation is ours: another
                    # writer that set its own since (two replicas taking a pod over at once)
                    # keeps what it wrote.
                    await shared.clear_pod(pod, generation=generation)
                for medium, keys in snapshot.exact_batches(self._batch):
                    if not await shared.add(pod, keys, medium=medium, generation=generation):
                        break  # another writer set a newer generation: the pod is its now
                now = self.local.clock()
                for ttl, keys in snapshot.approximate_batches(now, self._batch):
                    await shared.add_approximate(pod, keys, ttl)
            while (queue := self._rebuilding[pod]) is not None and queue:
                await queue.popleft()(shared)
        except BaseException:
            self._rebuilding.pop(pod, None)
            self._lost(pod, "forget_pod" if forget else "rebuild")
            raise
        if self._rebuilding.pop(pod) is None:  # the queue overflowed: rebuild it again
            self._unsynced.add(pod)

    # -- reads -------------------------------------------------------------------------------

    async def _read(self, operation: str, call: Awaitable[Any]) -> Any:
        try:
            result = await call
        except Exception as exc:
            self._read_failed(operation, exc)
            return _FAILED
        self._read_failures = 0
        return result

    async def lookup(
        self,
        keys: Sequence[BlockKey],
        pods: Collection[str] | None = None,
        *,
        medium: str | None = None,
    ) -> dict[str, int]:
        self._maybe_resync()
        if self.degraded:
            return await self.local.lookup(keys, pods, medium=medium)
        found = await self._read("lookup", self.shared.lookup(keys, pods, medium=medium))
        if found is _FAILED:
            return await self.local.lookup(keys, pods, medium=medium)
        if not (self._unsynced or self._rebuilding):
            return found  # type: ignore[no-any-return]
        unsynced = self.unsynced if pods is None else self.unsynced & set(pods)
        if not unsynced:
            return found  # type: ignore[no-any-return]
        # The shared answer is stale for these pods until they are rebuilt: use the local one.
        result = {pod: n for pod, n in found.items() if pod not in unsynced}
        result.update(await self.local.lookup(keys, unsynced, medium=medium))
        return result

    async def owner_silent(self, pod: str, generation: str, seconds: float) -> bool:
        self._maybe_resync()
        if not self.degraded:
            found = await self._read(
                "owner_silent", self.shared.owner_silent(pod, generation, seconds)
            )
            if found is not _FAILED:
                return found  # type: ignore[no-any-return]
        return await self.local.owner_silent(pod, generation, seconds)

    async def get_generation(self, pod: str) -> str | None:
        self._maybe_resync()
        if not self.degraded and pod not in self.unsynced:
            found = await self._read("get_generation", self.shared.get_generation(pod))
            if found is not _FAILED:
                return found  # type: ignore[no-any-return]
        return await self.local.get_generation(pod)

    async def pods(self) -> set[str]:
        self._maybe_resync()
        if not self.degraded:
            found = await self._read("pods", self.shared.pods())
            if found is not _FAILED:
                unsynced = self.unsynced
                local: set[str] = await self.local.pods()
                return (found - unsynced) | (local & unsynced)  # type: ignore[no-any-return]
        return await self.local.pods()

    async def audit(self, pods: Collection[str]) -> tuple[str, set[str]]:
        return await self.local.audit(pods)  # what it answers for is rebuilt, never lost

    async def stats(self) -> IndexStats:
        self._maybe_resync()
        if not self.degraded:
            found = await self._read("stats", self.shared.stats())
            if found is not _FAILED:
                return found  # type: ignore[no-any-return]
        return await self.local.stats()

    # -- writes ------------------------------------------------------------------------------

    async def _write(
        self, operation: str, pod: str, call: _Call, generation: str | None = None
    ) -> Any:
        result = await call(self.local)
        self._maybe_resync()
        if pod in self._rebuilding:
            queue = self._rebuilding[pod]
            if queue is not None:
                queue.append(call)
                if len(queue) > self._max_queued:
                    self._rebuilding[pod] = None
            return result
        if self.degraded or pod in self._unsynced:
            self._lost(pod, operation)
            return result
        self._inflight[pod] = self._inflight.get(pod, 0) + 1
        try:
            if self._epoch is None:  # what our writes go to: a loss after this one shows
                self._epoch, _missing = await self.shared.audit(())
            applied = await call(self.shared)
        except Exception as exc:
            self._failed(operation, exc)
            self._lost(pod, operation)
            return result
        finally:
            left = self._inflight.pop(pod) - 1
            if left:
                self._inflight[pod] = left
        if applied is False and result and generation is not None:
            self._refused(pod, generation)
        return result

    def _refused(self, pod: str, generation: str) -> None:
        """The shared index refused a write of `generation` that the local view took: another
        writer's generation owns `pod` there (the router replica or indexer that started
        last), and an owner that is alive writes the same event within moments. A quarter of
        `owner_silence_seconds` later (`_check_owners`) the owner is asked whether it wrote
        anything from that long before the refused write on; one that did not stopped (a
        replica scaled down or killed, whose generation would otherwise hold the pod for
        good, every later write refused): the pod is rebuilt there from the local view, under
        `generation`, as after a lost write. An owner found alive is not asked about again for
        `owner_silence_seconds`."""
        now = self._clock()
        suspect = self._suspects.get(pod)
        if suspect is None:
            suspect = self._suspects[pod] = _Suspect(generation, None)
        if suspect.since is None and now >= suspect.quiet_until:
            suspect.since, suspect.generation = now, generation
            self._next_owner_check = min(self._next_owner_check, now + self._owner_margin)

    async def _check_owners(self) -> None:
        """Ask about the owners of the pods refused long enough ago (`_refused`)."""
        margin = self._owner_margin
        try:
            now = self._clock()
            self._next_owner_check = math.inf
            for pod, suspect in list(self._suspects.items()):
                since = suspect.since
                if since is None:
                    continue
                if now - since < margin:
                    self._next_owner_check = min(self._next_owner_check, since + margin)
                    continue
                suspect.since, suspect.quiet_until = None, now + self._owner_silence
                try:
                    silent = await self.shared.owner_silent(
                        pod, suspect.generation, now - since + margin
                    )
                except Exception as exc:
                    self._failed("owner_silent", exc)
                    continue
                if silent and self._suspects.get(pod) is suspect and pod not in self._rebuilding:
                    log.warning(
                        "pod %s: its writer in the shared directory stopped; taking it over", pod
                    )
                    del self._suspects[pod]
                    self._lost(pod, "take_over")
                    self._retry_at = self._clock()
        finally:
            self.owner_task = None

    async def add(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        return await self._write(  # type: ignore[no-any-return]
            "add",
            pod,
            lambda i: i.add(pod, keys, medium=medium, generation=generation),
            generation,
        )

    async def remove(
        self,
        pod: str,
        keys: Sequence[BlockKey],
        *,
        medium: str = DEFAULT_MEDIUM,
        generation: str | None = None,
    ) -> bool:
        return await self._write(  # type: ignore[no-any-return]
            "remove",
            pod,
            lambda i: i.remove(pod, keys, medium=medium, generation=generation),
            generation,
        )

    async def add_approximate(self, pod: str, keys: Sequence[BlockKey], ttl_seconds: float) -> None:
        await self._write(
            "add_approximate", pod, lambda i: i.add_approximate(pod, keys, ttl_seconds)
        )

    async def clear_pod(self, pod: str, *, generation: str | None = None) -> None:
        await self._write("clear_pod", pod, lambda i: i.clear_pod(pod, generation=generation))

    async def forget_pod(self, pod: str) -> None:
        self._suspects.pop(pod, None)
        await self._write("forget_pod", pod, lambda i: i.forget_pod(pod))

    async def set_generation(self, pod: str, generation: str) -> bool:
        return await self._write(  # type: ignore[no-any-return]
            "set_generation", pod, lambda i: i.set_generation(pod, generation)
        )

    async def close(self) -> None:
        task, self.resync_task = self.resync_task, None
        await cancel_and_wait(task)
        owners, self.owner_task = self.owner_task, None
        await cancel_and_wait(owners)
        await self.local.close()
        try:
            await self.shared.close()
        except Exception as exc:
            log.warning("closing the shared directory failed: %r", exc)
