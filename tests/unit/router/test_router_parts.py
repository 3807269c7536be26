"""Pure parts of the router: classification, keys, usage, load parsing, sessions."""

import argparse

import pytest

from kvgate.api.router_config import EngineConfig, RouterConfig
from kvgate.router.command import add_arguments, config_from_args
from kvgate.router.core.classify import Classifier
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keys import Keyer
from kvgate.router.http.scrape import MAX_LORA_ADAPTERS, parse_load
from kvgate.router.http.upstream import UpstreamError
from kvgate.router.http.usage import SseUsageTap, usage_from_json_body


def _config(**extra):
    pools = [
        {"name": "on", "model": "m", "endpoints": {"static": [{"url": "http://a:1"}]}},
        {
            "name": "off",
            "model": "m",
            "pool_class": "batch",
            "endpoints": {"static": [{"url": "http://b:1"}]},
        },
    ]
    return RouterConfig.model_validate({"pools": pools, **extra})


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_tenants_get_their_salt_and_override_client_salts(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("key-b\n")
    cfg = _config(
        tenants={
            "tenants": [
                {"name": "a", "api_keys": [{"value": "key-a"}]},
                {"name": "b", "api_keys": [{"file": str(key_file)}], "cache_salt": {"value": "s"}},
            ],
            "salt_secret": {"value": "secret"},
        }
    )
    c = Classifier(cfg)
    a = c.classify({**BODY, "cache_salt": "b-salt-guess"}, {"authorization": "Bearer key-a"})
    b = c.classify(BODY, {"authorization": "Bearer key-b"})
    anon = c.classify(BODY, {})
    assert a.tenant == "a" and b.tenant == "b" and anon.tenant == "anonymous"
    assert b.cache_salt == "s"
    assert a.cache_salt not in (None, "b-salt-guess", b.cache_salt, anon.cache_salt)


def test_unknown_key_can_be_rejected():
    cfg = _config(
        tenants={"tenants": [{"name": "a", "api_keys": [{"value": "k"}]}], "unknown_key": "reject"}
    )
    with pytest.raises(RouterError) as exc:
        Classifier(cfg).classify(BODY, {"authorization": "Bearer wrong"})
    assert exc.value.status == 401


def test_without_tenants_client_salt_passes_through():
    c = Classifier(_config())
    assert c.classify({**BODY, "cache_salt": "x"}, {}).cache_salt == "x"
    assert c.classify(BODY, {}).tenant is None


def test_class_header_rules_and_pools():
    cfg = _config(
        classes={"rules": [{"request_class": "batch", "header": "x-job"}]},
        sessions={"header": "x-sid"},
    )
    c = Classifier(cfg)
    online = c.classify({**BODY, "user": "u1"}, {})
    assert online.request_class == "online"
    assert [p.name for p in online.home_pools] == ["on"]
    assert online.session_id == "u1"
    batch = c.classify(BODY, {"x-job": "1", "x-sid": "s"})
    assert batch.request_class == "batch"
    assert [p.name for p in batch.home_pools] == ["off"]
    assert [p.name for p in batch.borrow_pools] == ["on"]
    assert batch.session_id == "s"
    assert c.classify(BODY, {"x-kvgate-class": "batch"}).request_class == "batch"
    with pytest.raises(RouterError):
        c.classify(BODY, {"x-kvgate-class": "urgent"})


def test_approximate_keys_extend_across_turns_and_depend_on_salt():
    keyer = Keyer(EngineConfig())
    turn1 = {
        "messages": [{"role": "system", "content": "s" * 500}, {"role": "user", "content": "q"}]
    }
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "a" * 300}]}
    k1 = keyer.keys(turn1, "chat", None)
    k2 = keyer.keys(turn2, "chat", None)
    assert not k1.exact and len(k1.block_keys) > 5
    assert k2.block_keys[: len(k1.block_keys)] == k1.block_keys
    salted = keyer.keys(turn1, "chat", "tenant-a")
    assert salted.block_keys[0] != k1.block_keys[0]


def test_token_id_prompts_are_hashed_exactly():
    keyer = Keyer(EngineConfig(block_size=4))
    keys = keyer.keys({"prompt": list(range(10))}, "completion", None)
    assert keys.exact and keys.prompt_tokens == 10 and len(keys.block_keys) == 2
    assert keys.block_keys == keyer.hasher.block_keys(list(range(10)))
    with pytest.raises(RouterError):
        keyer.keys({"prompt": None}, "completion", None)


def test_sse_tap_strips_only_the_usage_chunk_across_split_chunks():
    stream = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1,'
        b'"prompt_tokens_details":{"cached_tokens":5}}}\n\n'
        b"data: [DONE]\n\n"
    )
    tap = SseUsageTap(strip_usage_chunk=True)
    out = b"".join(tap.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + tap.flush()
    assert out == b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'
    assert tap.usage is not None and tap.usage.cached_tokens == 5
    keep = SseUsageTap(strip_usage_chunk=False)
    assert keep.feed(stream) == stream


def test_usage_from_json_tolerates_garbage():
    assert usage_from_json_body(b"nope") is None
    assert usage_from_json_body(b'{"usage": {"prompt_tokens": 3}}').cached_tokens is None
    # counts a float cannot hold (or negative, or booleans) are read as absent
    huge = b"9" * 400
    assert usage_from_json_body(b'{"usage": {"prompt_tokens": ' + huge + b"}}") is None
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": ' + huge + b","
    body += b'"prompt_tokens_details": {"cached_tokens": -1}}}'
    usage = usage_from_json_body(body)
    assert usage is not None and usage.completion_tokens == 0 and usage.cached_tokens is None
    assert usage_from_json_body(b'{"usage": {"prompt_tokens": true}}') is None
    # nested past what Python's parser can recurse: absent, and the event passes through
    deep = b"[" * 100_000 + b"]" * 100_000
    assert usage_from_json_body(b'{"choices": [], "usage": ' + deep + b"}") is None
    event = b'data: {"choices": [], "usage": ' + deep + b"}\n\n"
    tap = SseUsageTap(strip_usage_chunk=True)
    assert tap.feed(event) == event and tap.usage is None


def test_parse_load_sums_label_sets_and_ignores_others():
    text = (
        "# HELP vllm:num_requests_waiting waiting\n"
        'vllm:num_requests_waiting{model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{model_name="b"} 1.0 1700000000\n'
        "vllm:num_requests_running 4\n"
        'vllm:kv_cache_usage_perc{model_name="a"} 0.5\n'
        'vllm:num_requests_waiting_total{model_name="a"} 99\n'
    )
    load = parse_load(text, now=1.0)
    assert (load.waiting, load.running, load.kv_cache_usage) == (3.0, 4.0, 0.5)


def test_parse_load_reads_the_newest_lora_requests_info():
    # vLLM sets a new label set to the current time after each step; old ones stay exposed.
    text = "\n".join(
        [
            "# TYPE vllm:lora_requests_info gauge",
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",'
            'waiting_lora_adapters=""} 1.7e9',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat",'
            'waiting_lora_adapters="code, sql"} 1.8e9',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
            'waiting_lora_adapters=""} 1.75e9',
            'vllm:num_requests_running{model_name="m"} 3',
        ]
    )
    load = parse_load(text, now=1.0)
    assert load.running_lora_adapters == {"chat"}
    assert load.waiting_lora_adapters == {"code", "sql"}
    assert load.max_lora == 2 and load.running == 3
    plain = parse_load('vllm:num_requests_running{model_name="m"} 1', now=1.0)
    assert plain.max_lora == 0 and not plain.running_lora_adapters
    bad = parse_load('vllm:lora_requests_info{max_lora="x",running_lora_adapters="a"} 1', now=1.0)
    assert bad.max_lora == 0 and bad.running_lora_adapters == {"a"}


def test_parse_load_bounds_a_pods_max_lora():
    """A pod stating 10^9 adapter slots would make the router remember every adapter name it
    ever reports as possibly loaded there."""
    text = 'vllm:lora_requests_info{max_lora="1000000000",running_lora_adapters="a"} 1'
    assert parse_load(text, now=1.0).max_lora == MAX_LORA_ADAPTERS


def test_parse_load_reads_the_kv_cache_size_and_the_tokens_written_into_it():
    # vLLM's exposition (prometheus_client counters end in _total); two data-parallel engines
    text = "\n".join(
        [
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0',
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="500"} 1.0',
            'vllm:prefix_cache_queries_total{engine="0"} 9000.0',
            'vllm:prefix_cache_queries_total{engine="1"} 1000.0',
            'vllm:prefix_cache_queries_created{engine="0"} 1.7e9',
            'vllm:prefix_cache_hits_total{engine="0"} 4000.0',
            'vllm:generation_tokens_total{engine="0"} 250.0',
        ]
    )
    load = parse_load(text, now=1.0)
    assert load.kv_capacity_tokens == 1500 * 16
    assert load.kv_written_tokens == 10_000 - 4000 + 250
    assert not load.kv_filled  # 6,250 tokens written into a 24,000-token cache
    assert parse_load(text.replace("9000.0", "30000.0"), now=1.0).kv_filled
    # before the cache is allocated, or without the counters: unknown
    early = parse_load('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1', now=1.0)
    assert early.kv_capacity_tokens == 0 and early.kv_written_tokens is None
    # a size no float holds (a pod may state 4,000 digits) is unknown too
    hostile = "\n".join(
        f'vllm:{name}{{model_name="m"}} {value}'
        for name, value in (
            ("num_requests_waiting", "+Inf"),
            ("num_requests_running", "-3"),
            ("kv_cache_usage_perc", "7.5"),
        )
    )
    bounded = parse_load(hostile, now=1.0)
    assert (bounded.waiting, bounded.running, bounded.kv_cache_usage) == (1e6, 0.0, 1.0)
    huge = parse_load(
        f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{"9" * 400}"}} 1', now=1.0
    )
    assert huge.kv_capacity_tokens == 0
    assert not early.kv_filled
    huge = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="' + "9" * 5000 + '"} 1'
    assert parse_load(huge, now=1.0).kv_capacity_tokens == 0
    partial = parse_load("vllm:prefix_cache_queries_total 5\nvllm:prefix_cache_hits_total 1", 1.0)
    assert partial.kv_written_tokens is None  # no generation counter: not vLLM's set


def test_quick_start_flags_build_a_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--endpoint",
            "http://127.0.0.1:8001",
            "--endpoint",
            "http://127.0.0.1:8002/",
            "--model",
            "m",
            "--policy",
            "least-load",
            "--port",
            "9000",
            "--kv-events",
            "http://127.0.0.1:8001=tcp://127.0.0.1:5557",
            "--shutdown-grace",
            "4.5",
        ]
    )
    cfg = config_from_args(args)
    eps = cfg.pools[0].endpoints.static
    assert [e.kv_events for e in eps] == ["tcp://127.0.0.1:5557", None]
    assert cfg.policy.name == "least-load" and cfg.server.port == 9000
    assert cfg.server.shutdown_grace_seconds == 4.5
    bad = parser.parse_args(
        ["--endpoint", "http://x:1", "--model", "m", "--kv-events", "http://y:1=tcp://z:1"]
    )
    with pytest.raises(ValueError):
        config_from_args(bad)
    with pytest.raises(ValueError):
        config_from_args(parser.parse_args([]))


def test_exact_chat_keys_match_the_engine_hashing_of_the_rendered_prompt():
    from pathlib import Path

    from kvgate.api.router_config import TokenizerConfig
    from kvgate.prefix import BlockHasher
    from kvgate.router.core.tokenize import load_request_tokenizer

    path = Path(__file__).parents[2] / "data" / "prefix" / "tokenizer"
    requests = load_request_tokenizer(TokenizerConfig(path=str(path)))
    engine = EngineConfig(hash_seed="42", tokenizer=TokenizerConfig(path=str(path)))
    keyer = Keyer(engine, requests)
    body = {
        "messages": [
            {"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "Explain prefix caching."},
        ]
    }
    keys = keyer.keys(body, "chat", "salt")
    ids = requests.chat_token_ids(body)
    assert keys.exact and keys.token_ids == ids and keys.prompt_tokens == len(ids)
    assert keys.block_keys == BlockHasher("sha256", 16, "42").block_keys(ids, cache_salt="salt")
    with pytest.raises(ValueError):
        load_request_tokenizer(TokenizerConfig(path=str(path / "missing")))


def test_usage_is_read_from_the_tail_even_when_content_mentions_usage():
    body = (
        b'{"choices":[{"message":{"content":"the \\"usage\\": field"}}],'
        b'"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}'
    )
    usage = usage_from_json_body(body)
    assert usage is not None and (usage.prompt_tokens, usage.cached_tokens) == (9, 4)
    assert usage_from_json_body(b'{"usage": null}') is None


async def test_long_prompts_are_tokenized_off_the_event_loop():
    import asyncio
    import random
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from kvgate.directory.factory import create_pool_index
    from kvgate.directory.metrics import DirectoryMetrics
    from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
    from kvgate.router.core.routing import Router
    from kvgate.router.runtime import build_state

    path = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"tokenizer": {"path": path}},
                    "endpoints": {"static": [{"url": "http://a:1"}]},
                }
            ]
        }
    )
    endpoints = EndpointSet()
    await endpoints.replace_pool("default/p", [EndpointSpec("a:1", "default/p", "http://a:1")])
    index = create_pool_index(
        config.directory, config.pools[0].key, DirectoryMetrics(CollectorRegistry())
    )
    router = Router(build_state(config), endpoints, {"default/p": index})
    rng = random.Random(0)
    words = ["cache", "router", "prefix", "token", "block", "queue", "agent", "pod"]
    text = " ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(40_000))
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    ticks = 0
    done = False

    async def ticker():
        nonlocal ticks
        while not done:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    plan = await router.plan(body, {}, "chat")  # no body size given: as /debug/route plans
    done = True
    await task
    assert plan.keys.exact and plan.keys.prompt_tokens > 50_000
    assert router.keying.offloaded == 1
    assert ticks >= 3  # the loop kept running while the prompt was tokenized


def test_sse_tap_handles_crlf_event_separators():
    stream = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    tap = SseUsageTap(strip_usage_chunk=True)
    first = tap.feed(stream[:20])
    assert first == b""
    out = first + tap.feed(stream[20:]) + tap.flush()
    assert out == b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert tap.usage is not None and tap.usage.prompt_tokens == 7


def test_sse_tap_finds_an_event_end_split_byte_by_byte_after_a_long_event():
    tap = SseUsageTap(strip_usage_chunk=True)
    event = b"data: " + b"x" * 5000 + b"\r\n\r\n"
    out = b"".join(tap.feed(event[i : i + 1]) for i in range(len(event)))
    assert out == event and tap.flush() == b""


def test_sse_tap_fails_an_event_that_never_ends_past_its_bound():
    tap = SseUsageTap(strip_usage_chunk=False, max_event_bytes=1000)
    assert tap.feed(b"data: a\n\n" + b"data: " + b"x" * 900) == b"data: a\n\n"
    with pytest.raises(UpstreamError) as failed:
        for _ in range(10):
            tap.feed(b"x" * 50)
    assert failed.value.kind == "stream"


async def test_lora_adapter_requests_are_hashed_with_the_adapter_key():
    from prometheus_client import CollectorRegistry

    from kvgate.directory.factory import create_pool_index
    from kvgate.directory.metrics import DirectoryMetrics
    from kvgate.discovery.endpoints import EndpointSet, EndpointSpec
    from kvgate.prefix import BlockHasher, LoraKey
    from kvgate.router.core.routing import Router
    from kvgate.router.runtime import build_state

    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "model": "base",
                    "lora_adapters": [{"name": "sql-lora", "path": "/adapters/sql"}],
                    "endpoints": {"static": [{"url": "http://a:1"}]},
                }
            ]
        }
    )
    assert config.pools[0].model_names == ["base", "sql-lora"]
    endpoints = EndpointSet()
    await endpoints.replace_pool("default/p", [EndpointSpec("a:1", "default/p", "http://a:1")])
    index = create_pool_index(
        config.directory, config.pools[0].key, DirectoryMetrics(CollectorRegistry())
    )
    router = Router(build_state(config), endpoints, {"default/p": index})
    prompt = list(range(64))
    base = await router.plan({"model": "base", "prompt": prompt}, {}, "completion")
    lora = await router.plan({"model": "sql-lora", "prompt": prompt}, {}, "completion")
    hasher = BlockHasher()
    assert base.keys.block_keys == hasher.block_keys(prompt)
    assert lora.keys.block_keys == hasher.block_keys(
        prompt, lora=LoraKey("sql-lora", "/adapters/sql")
    )
    assert set(base.keys.block_keys).isdisjoint(lora.keys.block_keys)


def test_flags_override_a_config_files_server_section(tmp_path):
    path = tmp_path / "router.yaml"
    path.write_text(
        "server: {port: 7000, max_connections: 10}\n"
        "pools: [{name: p, model: m, endpoints: {static: [{url: 'http://a:1'}]}}]\n"
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--config", str(path), "--shutdown-grace", "0"]))
    assert (cfg.server.port, cfg.server.max_connections) == (7000, 10)
    assert cfg.server.shutdown_grace_seconds == 0
    with pytest.raises(ValueError):
        config_from_args(parser.parse_args(["--config", str(path), "--shutdown-grace", "-1"]))


def test_a_bodys_digest_walks_a_bounded_number_of_values(monkeypatch):
    """One made-up field of 1M tiny objects took 0.5 s to digest, in one call that held the
    GIL: the walk stops at `MAX_DIGEST_NODES` values (a longer list or object is digested by
    its length), and what it walked still tells turns apart, markers left out."""
    from kvgate.router.core import sessions

    monkeypatch.setattr(sessions, "MAX_DIGEST_NODES", 50)
    first = {"role": "user", "content": [{"type": "text", "text": "a"}], "meta": list(range(30))}
    marked = {**first, "content": [{"type": "text", "text": "a", "cache_control": {"t": 1}}]}
    changed = {**first, "content": [{"type": "text", "text": "b"}]}
    body = {"messages": [first, {"role": "assistant", "content": "x"}] + [first] * 10}
    digest = sessions.digest_body(body)["messages"]
    assert digest[-1] == "+9" and len(digest) == 4  # the rest by its length
    same = sessions.digest_body({"messages": [marked]})["messages"][0]
    assert same == digest[0]
    assert (
        sessions.digest_body({"messages": [changed]})["messages"][0]["content"]
        != (digest[0]["content"])
    )
    huge = {"messages": [{"role": "user", "content": "hi", "meta": [{"b": 1}] * 1_000_000}]}
    assert sessions.digest_body(huge)["messages"][0]["meta"]  # digested by its length
    # each top-level field walks on its own budget, and values are delimited
    tools = [{"name": "t"}]
    big = sessions.digest_body({"messages": [first] * 40, "tools": tools})
    assert big["tools"] == sessions.digest_body({"messages": [], "tools": tools})["tools"]
    one, other = (sessions.digest_body({"messages": [], "tools": t}) for t in ([1, 23], [12, 3]))
    assert one["tools"] != other["tools"]
