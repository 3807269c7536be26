"""Several load-generator processes: how the workload is shared and how their health merges."""

import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.bench.clients import ClientProcessError, _receive, merged_health, shard
from kvgate.bench.records import GeneratorHealth
from kvgate.bench.workload import Session, Workload, completion_request


def _workload() -> Workload:
    requests = tuple(completion_request(f"r{i}", [i], 1, 10.0 - i) for i in range(7))
    sessions = tuple(
        Session(
            f"s{j}",
            0.1 * j,
            tuple(completion_request(f"s{j}t{k}", [j, k], 1, 0.0) for k in range(3)),
        )
        for j in range(5)
    )
    return Workload("w", requests, sessions)


def test_every_request_goes_to_one_client_and_sessions_stay_whole():
    workload = _workload()
    shards = [shard(workload, i, 3) for i in range(3)]
    sent = [r.request_id for s in shards for r in s.all_requests()]
    assert sorted(sent) == sorted(r.request_id for r in workload.all_requests())
    # open-loop requests go round the clients in arrival order (r6 arrives first)
    assert [r.request_id for r in shards[0].requests] == ["r6", "r3", "r0"]
    assert [s.session_id for s in shards[1].sessions] == ["s1", "s4"]
    assert all(len(s.turns) == 3 for sh in shards for s in sh.sessions)
    assert shard(workload, 0, 1).size == workload.size


def test_merged_health_keeps_the_worst_client_and_every_late_send():
    a = GeneratorHealth(0.02, 0.01, 0.05, 1, [(3.0, 0.3)])
    b = GeneratorHealth(0.2, 0.04, 0.4, 5, [(1.0, 0.4)])
    merged = merged_health([a, b], [30, 10])
    assert (merged.max_send_lag_s, merged.max_loop_lag_s, merged.late_sends) == (0.2, 0.4, 6)
    assert abs(merged.mean_send_lag_s - (0.01 * 30 + 0.04 * 10) / 40) < 1e-12
    assert merged.loop_stalls == [(1.0, 0.4), (3.0, 0.3)]


def _exit_at_once(conn) -> None:
    raise SystemExit(3)


async def test_a_client_process_that_dies_fails_the_run_with_its_exit_code():
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=_exit_at_once, args=(theirs,), name="client-1")
    process.start()
    theirs.close()
    with ThreadPoolExecutor(1) as readers, pytest.raises(ClientProcessError, match="exit code 3"):
        await _receive(readers, process, mine, 60)
