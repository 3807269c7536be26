"""The router's keys for requests with AKV `cache` ops, and the body sent to each kind of pod."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tests.unit.router.fakes import make_config

from kvgate.api.router_config import CacheOpsConfig, EngineConfig, PoolConfig, TokenizerConfig
from kvgate.directory.memory import MemoryBlockIndex
from kvgate.directory.metrics import DirectoryMetrics
from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
from kvgate.prefix import message_ends
from kvgate.prefix.cache_ops import OpHistory, history_block_keys, parse_cache_ops
from kvgate.router.core.cache_policy import added_cache_ops
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keys import Keyer
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.routing import Router
from kvgate.router.core.tokenize import load_request_tokenizer
from kvgate.router.metrics import RouterMetrics
from kvgate.router.runtime import build_state
from kvgate.router.server.forward import forward_body

TOKENIZER = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"


def _prompt(n: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 3000) for _ in range(n)]


def test_token_prompt_with_ops_is_branched_only_on_pools_that_support_them() -> None:
    ids = _prompt(400)
    cache = {"segments": [100, 100, 100], "drop": {"2": [1]}}
    body = {"prompt": ids, "cache": cache}
    akv = Keyer(EngineConfig(cache_ops=True))
    plain = Keyer(EngineConfig())
    keys = akv.keys(body, "completion", None)
    ops = parse_cache_ops(cache, 4)
    assert ops is not None
    expected = history_block_keys(akv.hasher, ids, OpHistory.from_ops(ops, [100, 200, 300, 400]))
    assert keys.block_keys == expected
    assert keys.lookup is not None and len(keys.lookup.keys) < len(keys.block_keys)
    # a pod without ops ignores `cache`: vLLM-exact keys, as with no field at all
    ignored = plain.keys(body, "completion", None)
    assert ignored.block_keys == plain.keys({"prompt": ids}, "completion", None).block_keys
    assert ignored.block_keys == plain.hasher.block_keys(ids)
    assert ignored.lookup is None


@pytest.mark.parametrize(
    ("cache", "match"),
    [
        ({"drop": {"1": [0]}}, "segments"),
        ({"segments": [500], "drop": {"0": [0]}}, "covers 500"),
        ({"segments": [100, 100], "drop": {"7": [0]}}, "out of range"),
        ("drop", "must be an object"),
    ],
)
def test_bad_ops_are_a_400(cache: object, match: str) -> None:
    with pytest.raises(RouterError, match=match) as info:
        Keyer(EngineConfig(cache_ops=True)).keys(
            {"prompt": _prompt(400), "cache": cache}, "completion", None
        )
    assert info.value.status == 400 and info.value.body()["error"]["param"] == "cache"


def test_chat_ops_are_checked_on_every_pool() -> None:
    with pytest.raises(RouterError, match="out of range") as info:
        Keyer(EngineConfig()).keys(
            {"messages": [{"role": "user", "content": "hi"}], "cache": {"drop": {"3": [0]}}},
            "chat",
            None,
        )
    assert info.value.status == 400


def test_chat_turns_with_a_rolling_drop_extend_each_other() -> None:
    requests = load_request_tokenizer(TokenizerConfig(path=str(TOKENIZER)))
    assert requests is not None
    keyer = Keyer(
        EngineConfig(cache_ops=True, tokenizer=TokenizerConfig(path=str(TOKENIZER))), requests
    )
    history = [{"role": "system", "content": "You fix bugs. " * 30}]
    previous: list[bytes] = []
    tools: list[int] = []
    for turn in range(6):
        history.append({"role": "user", "content": f"tool output {turn} " * 40})
        tools.append(len(history) - 1)
        drop = {str(tools[k]): [tools[k - 2]] for k in range(2, len(tools))}
        body = {"messages": history, "cache": {"drop": drop}} if drop else {"messages": history}
        keys = keyer.keys(body, "chat", None)
        assert keys.block_keys[: len(previous)] == previous[: len(keys.block_keys)]
        if len(drop) >= 2:  # an op before the last message: its blocks are branched
            assert keys.lookup is not None
            # not a hit of the same history without drops past the first op
            plain = keyer.keys({"messages": history}, "chat", None).block_keys
            assert plain != keys.block_keys
        # the next turn's prompt ends with this turn's answer, not the generation prompt's tail
        previous = keys.block_keys[:-1]
        history.append({"role": "assistant", "content": f"run step {turn} " * 10})


def test_ops_naming_more_ends_than_a_request_may_render_key_the_shared_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each new end renders its head: past the render budget the keys are those of the
    messages up to the first op (as without a tokenizer), and the next turns render on."""
    monkeypatch.setattr(message_ends, "MIN_RENDER_BUDGET", 0)
    requests = load_request_tokenizer(TokenizerConfig(path=str(TOKENIZER)))
    assert requests is not None
    keyer = Keyer(
        EngineConfig(cache_ops=True, tokenizer=TokenizerConfig(path=str(TOKENIZER))), requests
    )
    history = [{"role": "user", "content": f"step {i} " * 30} for i in range(40)]
    body = {"messages": history, "cache": {"drop": {"39": list(range(39))}}}
    ids = requests.chat_token_ids(body)
    head = {**body, "messages": history[:40], "add_generation_prompt": False}
    memo = requests._message_ends
    keys = keyer.keys(body, "chat", None)
    assert memo.rendered < 40  # 4 x 40 messages rendered: the heads of messages 0-16
    assert keys.prompt_tokens == len(ids) and keys.lookup is None
    shared = len(requests.chat_token_ids(head)) // keys.block_tokens
    assert keys.block_keys == keyer.keys({"messages": history}, "chat", None).block_keys[:shared]
    for _ in range(8):  # later turns render the rest, then key every branch
        keys = keyer.keys(body, "chat", None)
    assert keys.lookup is not None and memo.rendered == 40


def test_forward_body_strips_ops_for_pods_without_them() -> None:
    body = {"model": "m", "prompt": [1, 2], "cache": {"drop": {"1": [0]}}}
    raw = json.dumps(body).encode()
    assert forward_body(raw, body, None, False, cache_ops=True) == raw
    stripped = json.loads(forward_body(raw, body, None, False, cache_ops=False))
    assert "cache" not in stripped and stripped["prompt"] == [1, 2]


def _tool_session(turns: int) -> list[dict[str, str]]:
    history = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "go"}]
    for turn in range(turns):
        history.append({"role": "assistant", "content": f"run {turn}"})
        history.append({"role": "tool", "content": f"output {turn} " * 20})
    return history


def test_rolling_drop_is_added_only_toward_pools_with_ops() -> None:
    config = CacheOpsConfig(rolling_drop=True, keep_tool_responses=2)
    akv = PoolConfig.model_validate(
        {"name": "a", "model": "m", "engine": {"cache_ops": True}, "endpoints": {"static": []}}
    )
    plain = PoolConfig.model_validate({"name": "b", "model": "m", "endpoints": {"static": []}})
    body = {"messages": _tool_session(4)}  # tool responses at 3, 5, 7, 9
    assert added_cache_ops(body, "chat", akv, config) == {"drop": {"7": [3], "9": [5]}}
    assert added_cache_ops(body, "chat", plain, config) is None
    assert added_cache_ops(body, "chat", akv, CacheOpsConfig()) is None  # opt-in
    own = {**body, "cache": {"drop": {"9": [3]}}}
    assert added_cache_ops(own, "chat", akv, config) is None  # the client's ops win
    assert added_cache_ops({"messages": _tool_session(2)}, "chat", akv, config) is None


async def test_the_router_keys_and_forwards_the_ops_it_adds() -> None:
    tokenizer = {"path": str(TOKENIZER)}
    config = make_config(
        1,
        pools=[
            {
                "name": "p",
                "model": "m",
                "engine": {"cache_ops": True, "tokenizer": tokenizer},
                "endpoints": {"static": [{"url": "http://pod0:8000"}]},
            }
        ],
        cache_ops={"rolling_drop": True, "keep_tool_responses": 2},
    )
    endpoints = EndpointSet(lambda: 0.0)
    pool = config.pools[0]
    core = RoutingCore(
        build_state(config),
        endpoints,
        {pool.key: MemoryBlockIndex()},
        RouterMetrics(),
        DirectoryMetrics(CollectorRegistry()).fallback_errors,
        clock=lambda: 0.0,
    )
    await endpoints.replace_pool(
        pool.key, [EndpointSpec("pod0:8000", pool.key, "http://pod0:8000")]
    )
    core.endpoints_changed(endpoints.in_pool(pool.key), [])
    body = {"model": "m", "messages": _tool_session(5)}
    plan = await core.plan(ClientRequest(body, {}, "chat", request_id="r"))
    assert plan.added_cache == {"drop": {"7": [3], "9": [5], "11": [7]}}
    client_sent = {**body, "cache": plan.added_cache}
    same = await core.plan(ClientRequest(client_sent, {}, "chat", request_id="s"))
    assert same.added_cache is None
    assert plan.keys.block_keys == same.keys.block_keys
    assert plan.keys.lookup is not None
    raw = json.dumps(body).encode()
    forwarded = json.loads(
        forward_body(raw, client_sent, None, False, cache_ops=True, changed=True)
    )
    assert forwarded["cache"] == plan.added_cache
    # A request queued before its plan is keyed (prompt_keys) as it will be sent: with the ops.
    request = ClientRequest(body, {}, "chat", request_id="q")
    cls = core.state.classifier.classify(body, {})
    queued = await core.router.prompt_keys(cls, body, "chat", request.keys_by_pool)
    assert queued.block_keys == plan.keys.block_keys
    assert queued.lookup is not None
    core.router.keying.close()


async def test_drops_and_a_cpu_tier_count_restorable_blocks_on_each_medium() -> None:
    """A pool with AKV ops and a CPU offloading tier: a pod that evicted the dropped blocks
    matches through the drop lookup, and its GPU count is taken the same way, on the GPU only."""
    from tests.unit.router.fakes import routing_core

    from kvgate.kvevents import MEDIUM_CPU

    engine = {"cache_ops": True, "cpu_offload": True}
    config = make_config(
        2,
        pools=[
            {
                "name": "p",
                "model": "m",
                "engine": engine,
                "endpoints": {"static": [{"url": f"http://pod{i}:8000"} for i in range(2)]},
            }
        ],
    )
    core, endpoints = await routing_core(config, [0.0], 2)
    pool = config.pools[0]
    cache = {"segments": [100, 100, 100], "drop": {"2": [1]}}
    keys = Keyer(pool.engine).keys({"prompt": _prompt(400), "cache": cache}, "completion", None)
    assert keys.lookup is not None
    needed = keys.lookup.keys
    index = core.router.indexes[pool.key]
    await index.add("pod0:8000", needed)  # dropped blocks evicted, the rest on the GPU
    half = len(needed) // 2
    await index.add("pod1:8000", needed[:half])  # the same, its second half in the CPU tier
    await index.add("pod1:8000", needed[half:], medium=MEDIUM_CPU)
    matched, on_gpu = await core.router._lookup(keys, endpoints.in_pool(pool.key))
    path_blocks = keys.lookup.path_blocks
    everything = path_blocks[len(needed)]
    assert everything > path_blocks[0]
    assert matched == {"pod0:8000": everything, "pod1:8000": everything}
    assert on_gpu == {"pod0:8000": everything, "pod1:8000": path_blocks[half]}
    core.router.keying.close()


async def test_a_pod_that_still_holds_its_latest_dropped_blocks_restores_its_history() -> None:
    """A session's latest drop lies in the block after the history a pod holds (the tokens
    after the boundary change from turn to turn). A pod that evicted the older dropped blocks
    but holds the latest ones restores the whole history, as the engine does; one that lost a
    latest dropped block restores only what precedes the first drop."""
    from tests.unit.router.fakes import routing_core

    config = make_config(
        2,
        pools=[
            {
                "name": "p",
                "model": "m",
                "engine": {"cache_ops": True},
                "endpoints": {"static": [{"url": f"http://pod{i}:8000"} for i in range(2)]},
            }
        ],
    )
    core, endpoints = await routing_core(config, [0.0], 2)
    pool = config.pools[0]
    # segments of 40 tokens: segment 1 (blocks 3-4) dropped at token 200, segment 3
    # (blocks 8-9) at token 280, inside block 17: the previous turn left blocks 0-16
    cache = {"segments": [40] * 8, "drop": {"4": [1], "6": [3]}}
    keys = Keyer(pool.engine).keys({"prompt": _prompt(330), "cache": cache}, "completion", None)
    held = [key for k, key in enumerate(keys.block_keys[:17]) if k not in (3, 4)]
    index = core.router.indexes[pool.key]
    await index.add("pod0:8000", held)
    await index.add("pod1:8000", [key for key in held if key != keys.block_keys[9]])
    matched, _on_gpu = await core.router._lookup(keys, endpoints.in_pool(pool.key))
    assert matched == {"pod0:8000": 17, "pod1:8000": 3}
    core.router.keying.close()


class _OverstatingIndex(MemoryBlockIndex):
    """A directory that answers more blocks than it was asked for (a fake Redis, say)."""

    async def lookup(self, keys, pods=None, *, medium=None):  # type: ignore[no-untyped-def]
        return {"pod0": len(keys) + 5, "pod1": -3}


async def test_a_directory_count_past_the_requests_keys_is_cut_to_them() -> None:
    keys = Keyer(EngineConfig(cache_ops=True)).keys(
        {"prompt": _prompt(400), "cache": {"segments": [100, 100, 100], "drop": {"2": [1]}}},
        "completion",
        None,
    )
    assert keys.lookup is not None
    held = await Router._held(_OverstatingIndex(), keys, ["pod0", "pod1"])  # was an IndexError
    assert held == {"pod0": len(keys.block_keys), "pod1": 0}
