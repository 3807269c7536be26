"""Keying off the loop (`keying.py`), length limits (`keys.py`) and bounded session state."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tests.unit.router.fakes import FakePods, make_config
from tests.unit.traced_bytes import traced_bytes

from kvgate.api.router_config import EngineConfig, KeyingConfig, RouterConfig, TokenizerConfig
from kvgate.router.core.classify import Classifier
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keying import KeyingPool, prompt_chars_at_least
from kvgate.router.core.keys import Keyer, RequestKeys
from kvgate.router.core.sessions import SessionTracker
from kvgate.router.core.tokenize import load_request_tokenizer
from kvgate.router.metrics import RouterMetrics

TOKENIZER = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
WORDS = ["cache", "router", "prefix", "token", "block", "queue", "agent", "pod"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(words))


def _keyer(**engine: Any) -> Keyer:
    tokenizer = TokenizerConfig(path=TOKENIZER)
    return Keyer(EngineConfig(tokenizer=tokenizer, **engine), load_request_tokenizer(tokenizer))


# -- where a prompt is keyed -----------------------------------------------------------------


def test_prompt_size_walk_is_bounded_and_iterative():
    assert prompt_chars_at_least({"prompt": "x" * 100}, 100)
    assert not prompt_chars_at_least({"prompt": "x" * 50}, 100)
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 70}]}]}
    assert prompt_chars_at_least(chat, 100) and not prompt_chars_at_least(chat, 200)
    deep: Any = "z"
    for _ in range(100_000):  # far deeper than the recursion limit
        deep = [deep]
    assert prompt_chars_at_least({"prompt": deep}, 1000)
    assert prompt_chars_at_least({"prompt": list(range(10**6))}, 64 * 1024)  # stops at once
    # A list of scalars counts 8 each, as one by one; strings in a list by their length.
    ids = {"prompt": [1, 2.0, True, None] * 25}
    assert prompt_chars_at_least(ids, 8 * 102) and not prompt_chars_at_least(ids, 8 * 102 + 1)
    texts = {"prompt": ["a" * 50, 1]}
    assert prompt_chars_at_least(texts, 8 + 8 + 50 + 8) and not prompt_chars_at_least(texts, 75)


class BlockingKeyer:
    """Stands in for a keyer whose prompts take as long as the test wants (a tokenizing one,
    unless `approximate`)."""

    def __init__(self, *, approximate: bool = False) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []
        self.requests = None if approximate else object()  # its tokenizer

    def keys(
        self, body: Any, kind: str, salt: Any, lora: Any, session: Any, **_: Any
    ) -> RequestKeys:
        self.threads.append(threading.current_thread().name)
        if body.get("block"):
            self.release.wait(10)
        return RequestKeys(1, [], 16, True)


async def test_small_prompts_run_inline_and_large_ones_in_workers():
    pool = KeyingPool(KeyingConfig(inline_max_chars=1000, workers=1, max_waiting_chars=0))
    keyer = BlockingKeyer()
    await pool.keys(keyer, {"prompt": "small"}, "completion", None, None, None)  # type: ignore[arg-type]
    await pool.keys(keyer, {"prompt": "x" * 2000}, "completion", None, None, None)  # type: ignore[arg-type]
    await pool.keys(keyer, {"prompt": "s"}, "completion", None, None, None, body_bytes=5000)  # type: ignore[arg-type]
    assert keyer.threads[0] == threading.current_thread().name
    assert all(name.startswith("kvgate-keying") for name in keyer.threads[1:])
    assert pool.offloaded == 2
    pool.close()


async def test_the_delayed_trim_is_not_put_off_by_each_offloaded_prompt():
    """Offloaded prompts arriving more often than `TRIM_DELAY_SECONDS` still get their trim:
    the one pending is kept, not restarted."""
    pool = KeyingPool(KeyingConfig(inline_max_chars=10, workers=1, max_waiting_chars=0))
    keyer = BlockingKeyer()
    await pool.keys(keyer, {"prompt": "x" * 100}, "completion", None, None, None)  # type: ignore[arg-type]
    pending = pool._trim
    await pool.keys(keyer, {"prompt": "y" * 100}, "completion", None, None, None)  # type: ignore[arg-type]
    assert pending is not None and pool._trim is pending
    pool.close()


async def test_large_prompts_beyond_workers_and_queue_are_refused_with_503():
    # Each walked prompt counts as 50 characters: one keyed, one waiting, the third refused.
    pool = KeyingPool(KeyingConfig(inline_max_chars=50, workers=1, max_waiting_chars=100))
    keyer = BlockingKeyer()
    large = {"prompt": "x" * 100, "block": True}
    held = [
        asyncio.create_task(pool.keys(keyer, large, "completion", None, None, None))  # type: ignore[arg-type]
        for _ in range(2)
    ]
    await asyncio.sleep(0.05)
    with pytest.raises(RouterError) as refused:
        await pool.keys(keyer, large, "completion", None, None, None)  # type: ignore[arg-type]
    assert refused.value.status == 503 and refused.value.code == "keying_overloaded"
    small = await pool.keys(keyer, {"prompt": "hi"}, "completion", None, None, None)  # type: ignore[arg-type]
    assert small.prompt_tokens == 1  # small prompts never wait for the workers
    keyer.release.set()
    await asyncio.gather(*held)
    assert pool.busy == 0
    pool.close()


async def test_a_burst_of_mid_sized_prompts_waits_and_a_huge_one_behind_it_is_refused():
    pool = KeyingPool(KeyingConfig(inline_max_chars=50, workers=1, max_waiting_chars=10_000))
    keyer = BlockingKeyer()
    mid = {"prompt": "x" * 100, "block": True}
    held = [
        asyncio.create_task(pool.keys(keyer, mid, "completion", None, None, None, body_bytes=100))  # type: ignore[arg-type]
        for _ in range(90)  # 9,000 bytes in hand: every one waits its turn
    ]
    await asyncio.sleep(0.05)
    assert pool.busy == 90 and pool.refused == 0
    with pytest.raises(RouterError) as refused:
        await pool.keys(keyer, mid, "completion", None, None, None, body_bytes=2_000)  # type: ignore[arg-type]
    assert refused.value.code == "keying_overloaded"
    keyer.release.set()
    await asyncio.gather(*held)
    assert pool.busy == 0 and pool._busy_chars == 0
    pool.close()


async def test_by_default_a_prompt_of_ten_thousand_characters_leaves_the_loop():
    pool = KeyingPool()
    keyer = BlockingKeyer()
    keyer.release.set()
    chat = {"messages": [{"role": "user", "content": "w " * 5_000}]}
    await pool.keys(keyer, chat, "chat", None, None, None)  # type: ignore[arg-type]
    await pool.keys(keyer, {"prompt": "w " * 1_000}, "completion", None, None, None)  # type: ignore[arg-type]
    assert keyer.threads[0].startswith("kvgate-keying")
    assert keyer.threads[1] == threading.current_thread().name
    pool.close()


async def test_a_pool_without_a_tokenizer_keys_eight_times_larger_prompts_inline():
    """Approximate keys of a 10-32 KiB body cost 0.12 ms; the hop to a worker cost more."""
    pool = KeyingPool()
    exact, approximate = BlockingKeyer(), BlockingKeyer(approximate=True)
    exact.release.set()
    chat = {"messages": [{"role": "user", "content": "w " * 10_000}]}  # 20 KiB
    for keyer in (exact, approximate):
        await pool.keys(keyer, chat, "chat", None, None, None)  # type: ignore[arg-type]
    huge = {"messages": [{"role": "user", "content": "w " * 40_000}]}  # 80 KiB
    await pool.keys(approximate, huge, "chat", None, None, None)  # type: ignore[arg-type]
    assert exact.threads[0].startswith("kvgate-keying")
    assert approximate.threads[0] == threading.current_thread().name
    assert approximate.threads[1].startswith("kvgate-keying")
    pool.close()


async def test_a_reload_resizes_the_worker_pool():
    pool = KeyingPool(KeyingConfig(inline_max_chars=50, workers=1))
    keyer = BlockingKeyer()
    large = {"prompt": "x" * 100}
    await pool.keys(keyer, large, "completion", None, None, None)  # type: ignore[arg-type]
    first = pool._executor
    pool.configure(KeyingConfig(inline_max_chars=50, workers=3))
    await pool.keys(keyer, large, "completion", None, None, None)  # type: ignore[arg-type]
    assert pool._executor is not first and pool._executor is not None
    assert pool._executor._max_workers == 3
    pool.close()
    assert pool._executor is None


async def test_small_prompts_are_keyed_while_a_large_one_is_in_a_worker():
    # The real keyer, its caches shared: no lock makes the small requests wait.
    keyer = _keyer()
    pool = KeyingPool(KeyingConfig(max_prompt_tokens=None))
    rng = random.Random(1)
    large = {"model": "m", "messages": [{"role": "user", "content": _text(rng, 400_000)}]}
    task = asyncio.create_task(pool.keys(keyer, large, "chat", None, None, None))
    await asyncio.sleep(0.05)
    waits = []
    while not task.done():
        small = {"model": "m", "messages": [{"role": "user", "content": _text(rng, 20)}]}
        started = time.perf_counter()
        await pool.keys(keyer, small, "chat", None, None, None)
        waits.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    keys = await task
    assert keys.prompt_tokens > 400_000
    assert len(waits) >= 5, "the large prompt finished too soon to measure anything"
    assert sorted(waits)[len(waits) // 2] < 0.05, waits
    pool.close()


# -- length limits ---------------------------------------------------------------------------


def test_prompts_over_max_model_len_get_vllms_400():
    keyer, unlimited = _keyer(max_model_len=200), _keyer()
    rng = random.Random(2)
    chat = {"messages": [{"role": "user", "content": _text(rng, 400)}]}
    with pytest.raises(RouterError) as raised:
        keyer.keys(chat, "chat", None)
    err = raised.value
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "messages"
    assert err.message.startswith("This model's maximum context length is 200 tokens.")
    with pytest.raises(RouterError):
        keyer.keys({"prompt": _text(rng, 400)}, "completion", None)
    with pytest.raises(RouterError) as ids:
        _keyer(max_model_len=10).keys({"prompt": list(range(11))}, "completion", None)
    assert "has 11 input tokens" in ids.value.message
    fits = {"messages": [{"role": "user", "content": _text(rng, 20)}]}
    assert keyer.keys(fits, "chat", "s") == unlimited.keys(fits, "chat", "s")
    # Truncation: vLLM tokenizes everything and keeps the last k tokens; k fits.
    truncated = {"prompt": _text(rng, 400), "truncate_prompt_tokens": 100}
    assert keyer.keys(truncated, "completion", None).prompt_tokens == 100


def test_the_routers_own_cap_applies_where_the_pool_allows_more():
    rng = random.Random(3)
    body = {"prompt": _text(rng, 2000)}  # ~7k tokens
    for keyer in (_keyer(), _keyer(max_model_len=100_000)):
        with pytest.raises(RouterError) as raised:
            keyer.keys(body, "completion", None, max_prompt_tokens=1000)
        assert raised.value.code == "prompt_too_long"
        assert "accepts prompts of at most 1000 tokens" in raised.value.message
    with pytest.raises(RouterError) as model:
        _keyer(max_model_len=500).keys(body, "completion", None, max_prompt_tokens=1000)
    assert model.value.code == "context_length_exceeded"


def test_only_the_first_prompt_of_a_batch_is_tokenized():
    keyer = _keyer(max_model_len=1000)
    huge = "word " * 2_000_000  # tokenizing it would take seconds; it is never looked at
    started = time.perf_counter()
    keys = keyer.keys({"prompt": ["a short prompt", huge]}, "completion", None)
    assert keys.prompt_tokens < 20 and time.perf_counter() - started < 0.5


def test_a_huge_prompt_over_the_limit_costs_no_tokenization():
    keyer = _keyer(max_model_len=131_072)
    body = {"messages": [{"role": "user", "content": "many words " * 1_500_000}]}  # 16 MB
    started = time.perf_counter()
    with pytest.raises(RouterError):
        keyer.keys(body, "chat", None)
    assert time.perf_counter() - started < 0.5  # render + the character bound, no tokenizer


def test_approximate_keys_are_bounded_in_blocks():
    engine = EngineConfig(tokenizer=TokenizerConfig(approximate_max_blocks=100))
    keys = Keyer(engine).keys({"prompt": "x" * 1_000_000}, "completion", None)
    assert len(keys.block_keys) == 100 and keys.prompt_tokens == 250_000


# -- sessions --------------------------------------------------------------------------------


def test_long_session_ids_become_a_fixed_size_digest():
    classify = Classifier(make_config(1)).classify
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    def session(value: str, header: bool = True) -> str | None:
        if header:
            return classify(base, {"x-session-id": value}).session_id
        return classify({**base, "user": value}, {}).session_id

    assert session("short-id") == "short-id"
    long_a, long_b = "a" * 4096, "a" * 4095 + "b"
    assert session(long_a) == session(long_a, header=False) == session(long_a)
    assert session(long_a) != session(long_b)
    assert len(session(long_a) or "") == 34 and (session(long_a) or "").startswith("h:")
    assert session("\ud800" * 200, header=False) is not None  # lone surrogates from JSON


async def test_session_state_is_bounded_in_bytes(router_app):
    budget = 256 * 1024
    config = make_config(1, sessions={"max_state_bytes": budget})
    client, runtime = await router_app(config, FakePods())
    body = {"model": "m", "messages": [{"role": "user", "content": "question " * 200}]}
    for i in range(300):
        headers = {"x-session-id": f"{i:04d}" * 1000}  # 4 KB ids
        assert (
            await client.post("/v1/chat/completions", json=body, headers=headers)
        ).status_code == 200
    tracker = runtime.core.sessions
    assert 0 < tracker.bytes <= budget
    assert 0 < len(tracker) < 300
    assert all(len(key) <= 34 for key in tracker._turns)


async def test_session_state_counts_at_least_the_memory_its_turns_hold():
    """Turns of many short messages: each message's digest is a dict of its own (~180 bytes
    beside its values), which the count left out (it held 1.34x the budget)."""
    tracker = SessionTracker(
        RouterMetrics(CollectorRegistry()), max_sessions=1_000, max_bytes=1 << 30
    )
    bodies = []
    for s in range(50):
        messages = [{"role": "user", "content": f"msg {s} {i}"} for i in range(200)]
        keys = [bytes([s, i % 256]) * 16 for i in range(100)]
        plan = SimpleNamespace(
            classification=SimpleNamespace(session_id=f"session-{s:06d}"),
            keys=SimpleNamespace(block_keys=keys, block_tokens=16),
            pool=SimpleNamespace(key="ns/p"),
        )
        bodies.append((plan, json.loads(json.dumps({"model": "m", "messages": messages}))))
    gc.collect()
    with traced_bytes(__file__) as held:
        for plan, body in bodies:
            await tracker.observe(plan, body)  # type: ignore[arg-type]
        gc.collect()
    assert held.bytes <= tracker.bytes


def test_router_config_carries_the_limits():
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"max_model_len": 32768, "tokenizer": {"segment_cache_bytes": 0}},
                    "endpoints": {"static": [{"url": "http://a:1"}]},
                }
            ],
            "keying": {"workers": 4},
        }
    )
    assert config.pools[0].engine.max_model_len == 32768
    assert config.keying.workers == 4 and config.keying.inline_max_chars == 8 * 1024
    with pytest.raises(ValueError):
        RouterConfig.model_validate({**config.model_dump(), "keying": {"workers": 0}})
