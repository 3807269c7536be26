"""Several load-generator processes on one schedule, for a client that one process cannot drive.

One Python process sends a few hundred streamed requests a second before its own event loop
sets the pace (the report says so: send lag, loop stalls). ``run_clients(..., clients=N)``
splits the workload into N shards, runs N-1 of them in child processes (``spawn``) and one in
the caller's loop, all on one clock:

- **shards**: open-loop requests in arrival order go round the clients (request i to client
  i mod N); sessions likewise, each whole in one client (a session's turns follow each other);
- **one clock**: every child builds its HTTP client, says it is ready, and receives the wall
  clock instant (``time.time()``) at which every generator starts its schedule;
- **records**: a child sends each request's record to the parent as it completes (the progress
  callback sees every request), then its generator health; the parent merges the healths (the
  worst lag and stall of any client, late sends and stalls of all).

A child that dies or sends nothing fails the run with the child's exit code (no record is
invented for its requests). Children are stopped when the run ends, however it ends.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import httpx

from kvgate.bench.loadgen import LoadGenerator, ProgressCallback, http_client
from kvgate.bench.records import GeneratorHealth, RequestRecord
from kvgate.bench.workload import Workload

#: The schedule starts this long after the last child said it was ready.
START_LEAD_S = 0.25
#: How long a child may take to start and say it is ready (a spawn imports kvgate afresh).
READY_TIMEOUT_S = 60.0


class ClientProcessError(RuntimeError):
    pass


def shard(workload: Workload, index: int, count: int) -> Workload:
    """Client ``index``'s share of ``workload`` out of ``count`` (see the module docstring)."""
    requests = sorted(workload.requests, key=lambda r: r.arrival_s)
    return replace(
        workload,
        requests=tuple(requests[index::count]),
        sessions=tuple(workload.sessions[index::count]),
    )


def merged_health(healths: Sequence[GeneratorHealth], requests: Sequence[int]) -> GeneratorHealth:
    """One health for clients that ran side by side (``requests``: how many each sent)."""
    total = sum(requests)
    return GeneratorHealth(
        max_send_lag_s=max((h.max_send_lag_s for h in healths), default=0.0),
        mean_send_lag_s=(
            sum(h.mean_send_lag_s * n for h, n in zip(healths, requests, strict=True)) / total
            if total
            else 0.0
        ),
        max_loop_lag_s=max((h.max_loop_lag_s for h in healths), default=0.0),
        late_sends=sum(h.late_sends for h in healths),
        loop_stalls=sorted(stall for h in healths for stall in h.loop_stalls),
    )


async def run_clients(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    workload: Workload,
    *,
    clients: int = 1,
    duration_s: float | None = None,
    request_timeout_s: float = 300.0,
    progress: ProgressCallback | None = None,
) -> tuple[list[RequestRecord], GeneratorHealth]:
    """Replay ``workload`` against ``base_url`` from ``clients`` generators (the first on
    ``client`` in this loop); every request's record and the generators' merged health."""
    generator = LoadGenerator(
        client,
        base_url,
        model,
        duration_s=duration_s,
        request_timeout_s=request_timeout_s,
        progress=progress,
    )
    if clients <= 1:
        return await generator.run(workload)
    context = multiprocessing.get_context("spawn")
    children: list[tuple[Any, Connection]] = []
    # One thread per child waits on its pipe (the loop's default pool may have fewer threads
    # than there are children, and a child whose pipe is not read stalls on its next send).
    readers = ThreadPoolExecutor(max_workers=clients - 1, thread_name_prefix="bench-client")
    try:
        for index in range(1, clients):
            mine, theirs = context.Pipe()
            job = _Shard(
                shard(workload, index, clients),
                index,
                base_url,
                model,
                duration_s,
                request_timeout_s,
            )
            process = context.Process(
                target=_child, args=(theirs, job), name=f"kvgate-bench-client-{index}", daemon=True
            )
            # Starting a spawned child pickles its shard (prompts as token ids): not on the loop,
            # where the pod-load sampler is already running.
            await asyncio.get_running_loop().run_in_executor(readers, process.start)
            theirs.close()
            children.append((process, mine))
        for process, conn in children:
            await _receive(readers, process, conn, READY_TIMEOUT_S)
        start_at = time.time() + START_LEAD_S
        for _process, conn in children:
            conn.send(start_at)
        own = asyncio.create_task(generator.run(shard(workload, 0, clients), start_at=start_at))
        try:
            collected = await asyncio.gather(
                *(_collect(readers, p, c, progress) for p, c in children)
            )
        except BaseException:
            own.cancel()
            await asyncio.gather(own, return_exceptions=True)
            raise
        records, health = await own
    finally:
        for process, conn in children:
            conn.close()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        readers.shutdown(wait=False, cancel_futures=True)
    healths = [health, *(h for _recs, h in collected)]
    counts = [len(records), *(len(recs) for recs, _h in collected)]
    for recs, _h in collected:
        records.extend(recs)
    return records, merged_health(healths, counts)


async def _receive(
    readers: Executor, process: Any, conn: Connection, timeout_s: float | None = None
) -> Any:
    """The child's next message (waiting in a reader thread, not on the loop)."""

    def wait() -> Any:
        if timeout_s is not None and not conn.poll(timeout_s):
            raise ClientProcessError(f"{process.name} did not answer within {timeout_s:g}s")
        return conn.recv()

    try:
        return await asyncio.get_running_loop().run_in_executor(readers, wait)
    except (EOFError, OSError) as exc:
        process.join(timeout=5)
        raise ClientProcessError(f"{process.name} stopped (exit code {process.exitcode})") from exc


async def _collect(
    readers: Executor, process: Any, conn: Connection, progress: ProgressCallback | None
) -> tuple[list[RequestRecord], GeneratorHealth]:
    records: list[RequestRecord] = []
    while True:
        message = await _receive(readers, process, conn)
        if isinstance(message, GeneratorHealth):
            return records, message
        records.append(message)
        if progress is not None:
            progress(message)


@dataclass(frozen=True)
class _Shard:
    """What one child process sends: its share of the workload, and where and how."""

    workload: Workload
    index: int
    base_url: str
    model: str
    duration_s: float | None
    request_timeout_s: float


def _child(conn: Connection, job: _Shard) -> None:
    asyncio.run(_child_run(conn, job))


async def _child_run(conn: Connection, job: _Shard) -> None:
    async with http_client(job.request_timeout_s) as client:
        conn.send("ready")
        start_at = await asyncio.to_thread(conn.recv)
        generator = LoadGenerator(
            client,
            job.base_url,
            job.model,
            duration_s=job.duration_s,
            request_timeout_s=job.request_timeout_s,
            progress=conn.send,
            client_index=job.index,
        )
        _records, health = await generator.run(job.workload, start_at=start_at)
    conn.send(health)
