from __future__ import annotations

import argparse

import pytest

from kvgate.api.pool import InferencePoolSpec
from kvgate.operator.render.engine import engine_args
from kvgate.sim.config import add_vllm_arguments, config_from_args, parse_human_int


def _parse(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_vllm_arguments(parser)
    return config_from_args(parser.parse_args(argv), env or {})


def test_accepts_what_the_operator_renders() -> None:
    spec = InferencePoolSpec.model_validate(
        {"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": {"maxModelLen": 32768}}
    )
    argv = [a.replace("$(POD_IP)", "10.0.0.7") for a in engine_args(spec)]
    config = _parse(argv, {"PYTHONHASHSEED": "42", "POD_IP": "10.0.0.7"})
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert config.hash_seed == "42"
    assert config.enable_prompt_tokens_details
    assert config.engine.enable_prefix_caching
    assert config.engine.max_model_len == 32768
    assert config.kv_events.enabled
    assert config.kv_events.topic.startswith("kv@10.0.0.7@")
    assert config.kv_events.endpoint == "tcp://*:5557"


def test_unknown_flags_and_bad_values_are_errors() -> None:
    with pytest.raises(SystemExit):
        _parse(["--model", "m", "--enable-expert-parallel-typo"])
    with pytest.raises(ValueError, match="xxhash"):
        _parse(["--model", "m", "--prefix-caching-hash-algo", "xxhash"])
    with pytest.raises(argparse.ArgumentError):
        _parse(["--kv-events-config", '{"endpoint": "tcp://*:1", "bogus": 1}'])
    with pytest.raises(argparse.ArgumentError):
        _parse(["--gpu-memory-utilization", "1.5"])


def test_vllm_flag_conventions() -> None:
    config = _parse(["M", "--no-enable-prefix-caching", "--max-model-len", "32k"])
    assert config.model == "M" and not config.engine.enable_prefix_caching
    assert config.engine.max_model_len == 32000
    assert parse_human_int("8K") == 8192 and parse_human_int("1m") == 1_000_000
    default_events = _parse(["--kv-events-config", '{"enable_kv_cache_events": true}'])
    assert default_events.kv_events.publisher == "zmq"
    assert default_events.kv_events.endpoint == "tcp://*:5557"
    assert _parse([]).hash_seed is None


def test_kv_offloading_flags_as_vllm_spells_them() -> None:
    config = _parse(
        ["--model", "m", "--kv-offloading-backend", "native", "--kv-offloading-size", "8"]
    )
    assert config.engine.kv_offloading_size_gib == 8.0
    assert _parse(["--model", "m"]).engine.kv_offloading_size_gib == 0.0
    with pytest.raises(ValueError, match="native CPU offloading only"):
        _parse(["--model", "m", "--kv-offloading-backend", "lmcache", "--kv-offloading-size", "8"])
    with pytest.raises(ValueError, match=">= 0"):
        _parse(["--model", "m", "--kv-offloading-size", "-1"])
