"""A chat stream's first byte leaves with the first token, as in vLLM: vLLM's chat stream
generator yields the role-only chunk on the engine's first output, so a router that times the
first byte of the body measures TTFT (queue + prefill), not the HTTP round trip."""

from __future__ import annotations

import json
import re
import time

from tests.integration.sim.processes import SimFactory

SCALE = 20.0  # wall seconds per simulated second: prefill becomes seconds of wall time
_TTFT_SUM = re.compile(r"^vllm:time_to_first_token_seconds_sum\{[^}]*\}\s+(\S+)$", re.M)


def test_chat_stream_first_byte_waits_for_the_first_token(start_sim: SimFactory) -> None:
    pod = start_sim("--model", "m", "--max-model-len", "8192", "--sim-time-scale", f"{SCALE:g}")
    text = "The quick brown fox jumps over the lazy dog. " * 250  # ~2800 tokens, 4 chars each
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "stream": True,
    }
    started = time.monotonic()
    with pod.client.stream("POST", "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        chunks = resp.iter_bytes()
        first = next(chunks)
        first_byte_s = time.monotonic() - started
        raw = first + b"".join(chunks)
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    opening = json.loads(events[0])
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert json.loads(events[1])["choices"][0]["delta"]["content"]

    metrics = pod.client.get("/metrics").text
    ttft_sim = sum(float(v) for v in _TTFT_SUM.findall(metrics))
    assert ttft_sim > 0.05  # a long uncached prefill on the default profile
    # The engine's first token leaves at SCALE * ttft wall seconds after arrival; the first byte
    # of the body may not come earlier (before the fix it came within milliseconds).
    assert first_byte_s >= SCALE * ttft_sim * 0.95
