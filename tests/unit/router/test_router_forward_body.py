"""The body sent to the pod: what the pod parses is the client's body with the router's changes,
and fields the client did not send are written into its bytes, never by writing it anew."""

from __future__ import annotations

import json
import math
import random
from typing import Any

from kvgate.router.server.body import STRICT_JSON_ABOVE
from kvgate.router.server.forward import forward_body


def _expected(body: dict[str, Any], salt: str | None, add_usage: bool, cache_ops: bool,
              response_id: str | None) -> dict[str, Any]:  # fmt: skip
    """The old semantics, written the obvious way."""
    out = dict(body)
    if response_id is not None:
        out["request_id"] = response_id
    if salt is not None:
        out["cache_salt"] = salt
    else:
        out.pop("cache_salt", None)
    if not cache_ops:
        out.pop("cache", None)
    if add_usage:  # the client asked for no usage: per-chunk usage neither (vLLM's rule)
        options = dict(out.get("stream_options") or {})
        options.pop("continuous_usage_stats", None)
        out["stream_options"] = {**options, "include_usage": True}
    return out


def test_the_pod_reads_the_clients_body_with_the_routers_changes():
    rng = random.Random(0)
    for _ in range(400):
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi ☃"}]}
        for key, value in (("cache_salt", "client"), ("cache", {"drop": [1]}),
                           ("stream_options", {"continuous_usage_stats": True}),
                           ("request_id", "mine")):  # fmt: skip
            if rng.random() < 0.3:
                body[key] = value
        salt = rng.choice([None, "client", "tenant-salt"])
        add_usage, cache_ops = rng.random() < 0.5, rng.random() < 0.5
        # The router names the pod only in a Responses request that has no `request_id`.
        response_id = None if "request_id" in body else rng.choice([None, "resp_kg1"])
        pad = rng.choice(["", " ", "\n\t "])
        raw = (pad + json.dumps(body, indent=rng.choice([None, 1]))).encode()
        sent = forward_body(raw, body, salt, add_usage, cache_ops=cache_ops,
                            response_id=response_id)  # fmt: skip
        assert json.loads(sent) == _expected(body, salt, add_usage, cache_ops, response_id)
        # Fields the client did not send are added without rewriting its bytes.
        rewritten = (
            ("cache_salt" in body and body["cache_salt"] != salt)
            or ("cache" in body and not cache_ops)
            or ("stream_options" in body and add_usage)
        )
        if not rewritten:
            assert sent.endswith(raw[len(pad) + 1 :])


def test_a_kv_cache_report_mode_never_reaches_the_pod():
    """vLLM 0.33 reads `vllm_xargs.kv_cache_report_mode`; "full" publishes a BlockStored for
    every hit, which the directory counts as copies: an evicted block stayed listed."""
    body = {"model": "m", "prompt": "hi", "vllm_xargs": {"kv_cache_report_mode": "full", "a": 1}}
    sent = json.loads(forward_body(json.dumps(body).encode(), body, None, False, cache_ops=False))
    assert sent["vllm_xargs"] == {"a": 1} and sent["prompt"] == "hi"


def test_an_empty_object_a_nan_and_a_large_body():
    assert json.loads(forward_body(b" { } ", {}, "s", True, cache_ops=True)) == {
        "cache_salt": "s", "stream_options": {"include_usage": True}}  # fmt: skip
    small = b'{"model": "m", "temperature": NaN, "cache_salt": "x"}'
    sent = forward_body(small, json.loads(small), "y", False, cache_ops=True)
    parsed = json.loads(sent)
    assert parsed["cache_salt"] == "y" and math.isnan(parsed["temperature"])
    big = {"model": "m", "prompt": "é" * STRICT_JSON_ABOVE, "cache_salt": "x"}
    raw = json.dumps(big).encode()
    assert json.loads(forward_body(raw, big, "y", False, cache_ops=True)) == {
        **big,
        "cache_salt": "y",
    }
