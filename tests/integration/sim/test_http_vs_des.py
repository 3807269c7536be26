"""HTTP mode and discrete-event mode run the same engine: same arrivals, same TTFTs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.integration.sim.processes import SimFactory

from kvgate.sim.des import DESFleet, TraceRequest, routed_by
from kvgate.sim.engine import EngineConfig
from kvgate.sim.profile import H100_LLAMA3_8B


def test_http_ttfts_equal_des_ttfts_for_the_same_arrivals(start_sim: SimFactory) -> None:
    flags = ["--model", "m", "--block-size", "16", "--max-model-len", "8192",
             "--max-num-batched-tokens", "2048", "--max-num-seqs", "8",
             "--gpu-memory-utilization", "0.9", "--seed", "3"]  # fmt: skip
    pod = start_sim(*flags)
    prompts = [[5_000 * (i % 3 + 1) + t for t in range(1500 + 97 * i)] for i in range(12)]
    results: dict[int, tuple[float, float]] = {}

    def send(i: int) -> None:
        resp = pod.client.post(
            "/v1/completions", json={"model": "m", "prompt": prompts[i], "max_tokens": 6}
        )
        assert resp.status_code == 200, resp.text
        results[i] = (
            float(resp.headers["x-sim-arrival-seconds"]),
            float(resp.headers["x-sim-ttft-seconds"]),
        )

    for i in range(3):  # one at a time: idle engine, then prefix hits
        send(i)
    with ThreadPoolExecutor(max_workers=9) as pool:  # a burst that queues and batches
        list(pool.map(send, range(3, 12)))

    order = sorted(results, key=lambda i: results[i][0])
    trace = [TraceRequest(str(i), results[i][0], prompts[i], 6) for i in order]
    config = EngineConfig(
        block_size=16, max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=8, seed=3
    )
    fleet = DESFleet(1, config, H100_LLAMA3_8B, hash_seed="0")  # PYTHONHASHSEED=0 in the pod
    records = {r.request_id: r for r in fleet.run(trace, routed_by(lambda r, p, n: 0)).records}
    for i in order:
        assert records[str(i)].ttft == pytest.approx(results[i][1], rel=1e-9, abs=1e-12), i
    assert sum(1 for r in records.values() if r.cached_tokens > 0) >= 9
    assert max(r.queue_time for r in records.values()) > 0  # the burst really queued
