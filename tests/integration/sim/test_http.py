"""One simulated pod over real HTTP: the OpenAI API, errors, metrics and admin endpoints."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from tests.integration.sim.processes import SimFactory, SimProcess

from kvgate.promtext import sum_samples
from kvgate.router.http.scrape import parse_load

RUNNING = "vllm:num_requests_running"
LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 60  # ~675 fallback tokens


@pytest.fixture(scope="module")
def pod(start_sim_module: SimFactory) -> SimProcess:
    proc = start_sim_module(
        "--model", "org/model-8b", "--served-model-name", "m8b", "--block-size", "16",
        "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256",
        "--enable-prompt-tokens-details", "--max-model-len", "4096",
        "--gpu-memory-utilization", "0.9", "--max-num-seqs", "64",
    )  # fmt: skip
    return proc


def _complete(pod: SimProcess, **body: object) -> httpx.Response:
    return pod.client.post("/v1/completions", json={"model": "m8b", **body})


def test_same_long_prompt_twice_is_served_from_the_prefix_cache(pod: SimProcess) -> None:
    text = "first test. " + LONG_TEXT
    first = _complete(pod, prompt=text, max_tokens=4)
    second = _complete(pod, prompt=text, max_tokens=4)
    assert first.status_code == second.status_code == 200
    u1, u2 = first.json()["usage"], second.json()["usage"]
    assert u1["prompt_tokens"] == u2["prompt_tokens"] > 600
    assert u1["prompt_tokens_details"] == {"cached_tokens": 0}
    full_blocks = u2["prompt_tokens"] // 16 * 16
    if u2["prompt_tokens"] % 16 == 0:
        full_blocks -= 16  # vLLM recomputes the last prompt token
    assert u2["prompt_tokens_details"] == {"cached_tokens": full_blocks}
    assert float(second.headers["x-sim-ttft-seconds"]) < float(first.headers["x-sim-ttft-seconds"])
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]
    assert first.json()["choices"][0]["finish_reason"] == "length"


def test_token_id_prompts_and_unknown_fields(pod: SimProcess) -> None:
    resp = _complete(
        pod, prompt=list(range(1000, 1100)), max_tokens=2, priority=0,
        sampling_params={"x": 1}, return_text=True, rid="sglang-extra",
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == 100
    assert resp.json()["usage"]["completion_tokens"] == 2


def test_streaming_completion_in_vllm_chunk_format(pod: SimProcess) -> None:
    body = {"model": "m8b", "prompt": "hello", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with pod.client.stream("POST", "/v1/completions", json=body, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    # One chunk per engine step, unless the client lags and steps coalesce (vLLM does too).
    assert 1 <= len(text_chunks) <= 3
    assert all(c["object"] == "text_completion" for c in chunks)
    finishes = [c["choices"][0]["finish_reason"] for c in text_chunks]
    assert finishes == [None] * (len(text_chunks) - 1) + ["length"]
    plain = _complete(pod, prompt="hello", max_tokens=3).json()["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == plain
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_chat_streaming_and_non_streaming(pod: SimProcess) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    resp = pod.client.post(
        "/v1/chat/completions", json={"model": "m8b", "messages": messages, "max_tokens": 5}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"
    unlimited = pod.client.post("/v1/chat/completions", json={"model": "m8b", "messages": messages})
    assert unlimited.json()["usage"]["completion_tokens"] == 64  # --sim-chat-output-tokens
    assert unlimited.json()["choices"][0]["finish_reason"] == "stop"
    stream_body = {"model": "m8b", "messages": messages, "max_tokens": 2, "stream": True,
                   "stream_options": {"include_usage": True}}  # fmt: skip
    with pod.client.stream("POST", "/v1/chat/completions", json=stream_body, timeout=30) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    contents = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert contents == body["choices"][0]["message"]["content"][: len(contents)]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"prompt": "x" * 40000, "max_tokens": 1}, 400, "maximum context length is 4096"),
        ({"prompt": "hello", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"prompt": 42}, 400, "prompt"),
        ({"prompt": "hello", "stream": "yes"}, 400, "stream"),
        ({"prompt": "hello", "model": "other"}, 404, "does not exist"),
    ],
)
def test_invalid_requests_get_vllm_error_shape(
    pod: SimProcess, body: dict[str, object], status: int, fragment: str
) -> None:
    resp = pod.client.post("/v1/completions", json={"model": "m8b", **body}, timeout=30)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert fragment in error["message"]


def test_bad_json_is_a_400(pod: SimProcess) -> None:
    resp = pod.client.post("/v1/completions", content=b"{nope", timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "BadRequestError"


def test_metrics_use_vllm_names(pod: SimProcess) -> None:
    _complete(pod, prompt=LONG_TEXT, max_tokens=2)
    _complete(pod, prompt=LONG_TEXT, max_tokens=2)
    text = pod.client.get("/metrics", timeout=10).text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_sum", "vllm:inter_token_latency_seconds_count",
        "vllm:request_prefill_time_seconds_count",
    ):  # fmt: skip
        assert re.search(rf'^{name}{{[^}}]*model_name="m8b"', text, re.M), name
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'block_size="16"' in info and 'num_gpu_blocks="' in info
    hits = next(ln for ln in text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total"))
    assert float(hits.split()[-1]) > 600


def test_reset_prefix_cache_forgets_prefixes(pod: SimProcess) -> None:
    _complete(pod, prompt=LONG_TEXT, max_tokens=1)
    cached = _complete(pod, prompt=LONG_TEXT, max_tokens=1)
    assert cached.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    reset = pod.client.post("/reset_prefix_cache", timeout=10)
    assert reset.status_code == 200 and reset.json() == {"success": True}
    again = _complete(pod, prompt=LONG_TEXT, max_tokens=1)
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_info_endpoints_for_routers(pod: SimProcess) -> None:
    assert pod.client.get("/health", timeout=10).status_code == 200
    models = pod.client.get("/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["m8b"]
    assert models["data"][0]["max_model_len"] == 4096
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        resp = pod.client.get(path)
        assert resp.status_code == 200, path
    assert pod.client.get("/model_info", timeout=10).json()["model_path"] == "org/model-8b"
    assert pod.client.get("/nope", timeout=10).status_code == 404


def test_http2_prior_knowledge_is_refused_and_server_survives(pod: SimProcess) -> None:
    host, port = pod.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400") and b"connection: close" in reply
    assert pod.client.get("/health", timeout=10).status_code == 200


def test_unknown_flag_is_an_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "sim", "serve", "--model", "m", "--bogus", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --bogus" in result.stderr


def test_client_going_away_aborts_its_request(pod: SimProcess) -> None:
    body = {"model": "m8b", "prompt": "abort me", "max_tokens": 3000, "stream": True}
    with (
        httpx.Client(base_url=pod.url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as resp,
    ):
        next(resp.iter_lines())  # the request is running; leaving the block disconnects
    deadline = time.monotonic() + 10
    while True:
        metrics = pod.client.get("/metrics").text
        running = sum_samples(metrics, [RUNNING])[RUNNING]
        if running == 0:
            break
        assert time.monotonic() < deadline, "the aborted request kept running"
        time.sleep(0.05)


def test_time_scale_stretches_wall_clock_latency(start_sim: SimFactory) -> None:
    slow = start_sim("--model", "m", "--max-model-len", "8192", "--sim-time-scale", "20")
    started = time.monotonic()
    resp = slow.client.post(
        "/v1/completions", json={"model": "m", "prompt": list(range(3000)), "max_tokens": 1}
    )
    wall = time.monotonic() - started
    ttft = float(resp.headers["x-sim-ttft-seconds"])
    assert 0.08 < ttft < 0.2  # 3000 uncached tokens on the default H100 profile
    assert wall >= 20 * ttft * 0.95


def test_a_router_reads_the_kv_cache_size_and_when_it_has_filled(start_sim: SimFactory) -> None:
    """What the router's scrape makes of a pod's /metrics (`parse_load`): the cache's size
    from `vllm:cache_config_info`, and the tokens written into it from the counters; once
    they reach the size, every new block evicts one (`least-turnover` ties, docs/scoring.md)."""
    small = start_sim(
        "--model", "m", "--max-model-len", "1024", "--block-size", "16",
        "--num-gpu-blocks-override", "80", "--enable-prefix-caching",
    )  # fmt: skip
    before = parse_load(small.client.get("/metrics", timeout=10).text, now=1.0)
    assert before.kv_capacity_tokens == 80 * 16
    assert before.kv_written_tokens == 0 and not before.kv_filled
    for i in range(3):  # 3 x 500 new prompt tokens + 3 x 8 generated > 1,280
        prompt = list(range(i * 1000, i * 1000 + 500))
        resp = small.client.post(
            "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 8}
        )
        assert resp.status_code == 200
    after = parse_load(small.client.get("/metrics", timeout=10).text, now=2.0)
    assert after.kv_written_tokens == 3 * 500 + 3 * 8
    assert after.kv_filled
