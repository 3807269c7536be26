"""Pure parts of the live harness: target command lines, /metrics parsing, CLI arguments."""

import argparse
import sys
from pathlib import Path

import pytest

from kvgate.bench import bench_command, workloads
from kvgate.bench.fleet import parse_load
from kvgate.bench.targets import (
    UnknownTargetError,
    health_url,
    router_argv,
    sglang_workers_ready,
    target_names,
    validate_targets,
)

PODS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_kvgate_targets_run_the_router_with_their_policy():
    argv = router_argv("least-load", PODS, "m", 8123)
    assert argv[:3] == [sys.executable, "-m", "kvgate.cli"]
    assert argv[argv.index("--policy") + 1] == "least-load"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--endpoint"] == PODS
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--model") + 1] == "m"
    assert health_url("kvgate", "http://h:1") == "http://h:1/health"


def test_sglang_targets_use_the_sglang_policies(monkeypatch):
    monkeypatch.setattr("kvgate.bench.targets.sglang_router_binary", lambda: "/bin/sglang-router")
    argv = router_argv("sglang-cache-aware", PODS, "m", 8124)
    assert argv[:2] == ["/bin/sglang-router", "launch"]
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == PODS
    rr = router_argv("sglang-round-robin", PODS, "m", 8124)
    assert rr[rr.index("--policy") + 1] == "round_robin"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-port") + 1] != "29000"  # a free port, not the default
    # ready once a worker is healthy, not once the process listens (its first requests got 503)
    assert health_url("sglang-cache-aware", "http://h:1") == "http://h:1/readiness"


def test_sglang_is_ready_once_every_pod_is_a_healthy_worker():
    def workers(*healthy: bool) -> dict:
        return {
            "workers": [{"url": u, "is_healthy": h} for u, h in zip(PODS, healthy, strict=False)]
        }

    assert sglang_workers_ready(workers(True, True), PODS)
    assert not sglang_workers_ready(workers(True, False), PODS)
    assert not sglang_workers_ready(workers(True), PODS)  # the second not registered yet
    assert not sglang_workers_ready({"workers": "?"}, PODS)
    assert not sglang_workers_ready([], PODS)


def test_missing_sglang_router_is_an_explained_error(monkeypatch):
    from kvgate.bench.processes import StartError

    monkeypatch.setattr("kvgate.bench.targets.sglang_router_binary", lambda: None)
    with pytest.raises(StartError, match="pip install sglang-router"):
        router_argv("sglang-cache-aware", PODS, "m", 1)


def test_target_names_are_validated():
    assert set(target_names()) >= {"round-robin", "least-load", "prefix", "kvgate"}
    assert validate_targets(["kvgate"]) == ["kvgate"]
    with pytest.raises(UnknownTargetError):
        validate_targets(["kvgate", "random"])


def test_parse_load_reads_vllm_gauges():
    text = (
        "# HELP vllm:num_requests_running Number of requests running.\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{model_name="m"} 9.0\n'
    )
    assert parse_load(text) == (3.0, 2.0)
    assert parse_load("") == (0.0, 0.0)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_bench_run_arguments_build_the_workload(tmp_path: Path):
    sample = Path(__file__).resolve().parents[2] / "data" / "bench" / "mooncake_sample.jsonl"
    args = _args("run", "--trace", str(sample), "--speedup", "2", "--out", str(tmp_path))
    w = bench_command.load_workload(args)
    assert w.size == 24 and w.params["speedup"] == 2.0
    args = _args(
        "run",
        "--workload",
        "shared-prefix",
        "--param",
        "num_groups=2",
        "--param",
        "prompts_per_group=2",
        "--out",
        str(tmp_path),
    )
    assert bench_command.load_workload(args).size == 4
    with pytest.raises(SystemExit):
        _args("run", "--workload", "shared-prefix", "--trace", str(sample), "--out", "x")
    bad = _args("run", "--workload", "hot-prefix", "--speedup", "2", "--out", str(tmp_path))
    with pytest.raises(ValueError, match="--trace only"):
        bench_command.load_workload(bad)


def test_exit_code_says_whether_every_target_ran():
    assert bench_command.exit_code(["a", "b"], ["a", "b"]) == 0
    assert bench_command.exit_code(["a"], ["a", "b"]) == 1


def test_nested_policy_params():
    assert workloads.nested_params(
        ["cost_model.prior_prefill_tokens_per_second=30000", "tie_break=random", "tolerance=0.2"]
    ) == {
        "cost_model": {"prior_prefill_tokens_per_second": 30000},
        "tie_break": "random",
        "tolerance": 0.2,
    }


def test_bench_capacity_prints_the_round_robin_capacity(capsys):
    args = _args(
        "capacity",
        "--workload",
        "shared-prefix",
        "--param",
        "num_groups=2",
        "--param",
        "prompts_per_group=4",
        "--param",
        "output_len=4",
        "--pods",
        "2",
    )
    assert bench_command.run(args) == 0
    out = capsys.readouterr().out
    assert "shared-prefix on 2 pods:" in out and "req/s" in out and "75% =" in out


def test_agent_ideal_bound_tokenizes_what_the_pods_receive():
    from kvgate.bench.agent_sessions import render_chat_text

    tok_dir = Path(__file__).resolve().parents[2] / "data" / "prefix" / "tokenizer"
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    from kvgate.sim.text import load_codec

    codec = load_codec(str(tok_dir), "m", 32000)
    as_text = bench_command.chat_tokenizer(str(tok_dir), "completions")(messages)
    as_chat = bench_command.chat_tokenizer(str(tok_dir), "chat")(messages)
    assert as_text == codec.completion_token_ids({"prompt": render_chat_text(messages)})[0]
    assert as_chat == codec.chat_token_ids({"messages": messages})
    assert as_text != as_chat  # a real template renders differently from the stand-in text
