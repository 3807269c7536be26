"""What counting CPU-tier hits is worth: kvgate's routing core on simulated pods whose GPU cache
is too small for the working set and that offload evicted blocks to CPU memory (vLLM's native
offloading, `--kv-offloading-size`), with the pool's `engine.cpu_offload` on (CPU-tier events
indexed, a hit there priced as its copy back) or off (only GPU blocks count).

    .venv/bin/python -m pytest benchmarks/test_cpu_tier_routing.py -q -s

Discrete-event mode, default profile (H100, Llama-3.1-8B): 4 pods of 700 GPU blocks (11.2k
tokens) and a 4,000-block CPU tier each; 32 system prompts of 2,048 tokens (4,096 blocks of
prefixes, 1.5x the fleet's GPU cache) x 12 questions of 128 tokens, 64 output tokens, Poisson
arrivals at 6 req/s. Numbers are simulated seconds (deterministic for the seed).
"""

from __future__ import annotations

from benchmarks.directory_common import report

from kvgate.bench.des import run_des
from kvgate.bench.report import summarize
from kvgate.bench.shared_prefix import SharedPrefixParams, build_shared_prefix
from kvgate.sim.engine import EngineConfig
from kvgate.sim.profile import H100_LLAMA3_8B

GPU_BLOCKS = 700
CPU_BLOCKS = 4000


def _engine() -> EngineConfig:
    gib = CPU_BLOCKS * 16 * H100_LLAMA3_8B.kv_bytes_per_token / 1024**3
    return EngineConfig(num_gpu_blocks=GPU_BLOCKS, kv_offloading_size_gib=gib, max_model_len=4096)


def test_cpu_tier_hits_counted_vs_ignored() -> None:
    workload = build_shared_prefix(
        SharedPrefixParams(
            num_groups=32,
            prompts_per_group=12,
            system_prompt_len=2048,
            question_len=128,
            output_len=64,
            rate_rps=6.0,
            seed=1,
        )
    )
    results = {}
    for counted in (False, True):
        run = run_des(workload, "kvgate", 4, engine=_engine(), cpu_offload=counted)
        summary = summarize("counted" if counted else "ignored", run.records)
        results[counted] = summary
        report(
            f"CPU-tier hits {'counted (cpu_offload: true)' if counted else 'ignored'}",
            {
                "requests": summary.completed,
                "hit_rate": summary.hit_rate,
                "ttft_mean_s": summary.ttft_mean_s,
                "ttft_p50_s": summary.ttft_p50_s,
                "ttft_p90_s": summary.ttft_p90_s,
                "ttft_p99_s": summary.ttft_p99_s,
            },
        )
    ignored, counted = results[False], results[True]
    report(
        "counted / ignored",
        {
            "hit_rate": counted.hit_rate / ignored.hit_rate,
            "ttft_mean": counted.ttft_mean_s / ignored.ttft_mean_s,
            "ttft_p90": counted.ttft_p90_s / ignored.ttft_p90_s,
        },
    )
