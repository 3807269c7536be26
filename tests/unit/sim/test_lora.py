"""Multi-LoRA in the simulator: vLLM's adapter-aware block hashes and KV events, the max_loras
batch rule, the adapter load cost and `vllm:lora_requests_info`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from kvgate.kvevents import BlockStored
from kvgate.prefix import BlockHasher, LoraKey
from kvgate.promtext import parse_samples
from kvgate.sim.config import add_vllm_arguments, config_from_args
from kvgate.sim.engine import SimEngine
from kvgate.sim.lora import LoraConfig, LoraModule, lora_config
from kvgate.sim.metrics import PodMetrics

EngineFactory = Callable[..., SimEngine]
SQL = LoraModule("sql", "/adapters/sql", 1)
CHAT = LoraModule("chat", "/adapters/chat", 2)


def prompt(n: int) -> list[int]:
    return [1000 + i for i in range(n)]


def lora(max_loras: int = 1, load_seconds: float = 0.5) -> LoraConfig:
    return LoraConfig(modules=[SQL, CHAT], max_loras=max_loras, load_seconds=load_seconds)


def test_adapter_requests_hash_and_publish_as_vllm_does(make_engine: EngineFactory) -> None:
    engine = make_engine(lora=lora())
    req = engine.add_request("a", prompt(64), 1, 0.0, cache_salt="t", lora=SQL)
    steps = engine.run_until_idle()
    expected = BlockHasher("sha256", 16, None).hash_blocks(
        prompt(64), lora=LoraKey("sql", "/adapters/sql"), cache_salt="t"
    )
    assert req.block_hashes[:4] == expected
    stored = [e for s in steps for e in s.events if isinstance(e, BlockStored)]
    assert stored[0].block_hashes == expected[: len(stored[0].block_hashes)]
    assert (stored[0].lora_id, stored[0].lora_name) == (1, "sql")
    # vLLM's untagged event form: the adapter name on every block, the salt on block 0.
    assert stored[0].extra_keys is not None
    assert stored[0].extra_keys[:2] == [("sql", "t"), ("sql",)]


def test_an_adapter_shares_no_blocks_with_the_base_model(make_engine: EngineFactory) -> None:
    engine = make_engine(lora=lora(max_loras=2, load_seconds=0.0))
    engine.add_request("base", prompt(320), 1, 0.0)
    engine.run_until_idle()
    other = engine.add_request("sql", prompt(320), 1, 1.0, lora=SQL)
    same = engine.add_request("sql2", prompt(320), 1, 2.0, lora=SQL)
    engine.run_until_idle(1.0)
    assert other.num_cached_tokens == 0
    assert same.num_cached_tokens == 304  # 19 of 20 blocks: the last token is recomputed


def test_a_batch_holds_at_most_max_loras_adapters(make_engine: EngineFactory) -> None:
    engine = make_engine(lora=lora(max_loras=1, load_seconds=0.0))
    first = engine.add_request("a", prompt(32), 20, 0.0, lora=SQL)
    blocked = engine.add_request("b", prompt(40), 5, 0.0, lora=CHAT)
    base = engine.add_request("c", prompt(48), 5, 0.0)
    step = engine.step(0.0)
    assert first in engine.scheduler.running and base in engine.scheduler.running
    assert blocked in engine.scheduler.waiting  # skipped, kept in the queue
    assert engine.lora_adapters() == (["sql"], ["chat"])
    engine.run_until_idle(step.end)
    assert blocked.first_token_time is not None and first.finish_time is not None
    assert blocked.first_scheduled_time is not None
    assert blocked.first_scheduled_time >= first.finish_time


def test_loading_an_adapter_into_a_slot_costs_time(make_engine: EngineFactory) -> None:
    def ttft(engine: SimEngine, adapter: LoraModule, at: float) -> float:
        req = engine.add_request(f"r{at}", prompt(16), 1, at, lora=adapter)
        engine.run_until_idle(at)
        assert req.first_token_time is not None
        return req.first_token_time - at

    engine = make_engine(lora=lora(max_loras=1, load_seconds=0.5))
    cold = ttft(engine, SQL, 0.0)
    warm = ttft(engine, SQL, 10.0)
    swapped = ttft(engine, CHAT, 20.0)  # evicts sql from the only slot
    assert cold - warm == pytest.approx(0.5, abs=1e-6)
    assert swapped - warm == pytest.approx(0.5, abs=1e-6)


def test_lora_requests_info_names_running_and_waiting_adapters(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(lora=lora(max_loras=1, load_seconds=0.0))
    metrics = PodMetrics(engine, "m", {})
    engine.add_request("a", prompt(32), 20, 0.0, lora=SQL)
    engine.add_request("b", prompt(32), 5, 0.0, lora=CHAT)
    metrics.observe_step(engine.step(0.0))
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    [sample] = [s for s in parse_samples(text) if s.name == "vllm:lora_requests_info"]
    assert sample.labels == {
        "max_lora": "1",
        "running_lora_adapters": "sql",
        "waiting_lora_adapters": "chat",
    }
    assert sample.value > 1e9  # the wall time of the update, as vLLM sets it


def test_lora_flags_parse_like_vllm() -> None:
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser)
    args = parser.parse_args(
        ["--enable-lora", "--max-loras", "2", "--lora-modules", "sql=/a/sql",
         '{"name": "chat", "path": "/a/chat"}']
    )  # fmt: skip
    config = config_from_args(args, environ={})
    assert config.engine.lora is not None
    assert config.engine.lora.modules == [
        LoraModule("sql", "/a/sql", 1),
        LoraModule("chat", "/a/chat", 2),
    ]
    assert config.engine.lora.max_loras == 2
    with pytest.raises(ValueError, match="--enable-lora"):
        lora_config(False, [("a", "/p")], 1, 0.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--enable-lora", "--lora-modules", "no-path"])
