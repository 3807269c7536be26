"""A real `kvgate router` process in front of a real HTTP pod, and one client session whose
every turn breaks the prefix in a message field the client names: a new, long, unknown message
key each turn, with a new `cache_salt` (passed through without tenants) so that every block key
changes while role and content stay the same. The first differing field is then the client's key.
Before, each key became a `field` label value of `kvgate_router_prefix_breaks_total` (one new
series per request, never removed) and was logged whole in the break's INFO line."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tests.integration.router.edge_helpers import canned_pod, router_before_pod

pytestmark = pytest.mark.timeout(120)

TURNS = 200
KEY_CHARS = 4096  # a single key longer than the log line bound
ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 1},
    }
).encode()


_POD = canned_pod(lambda body: (ANSWER, "application/json"))


def test_client_chosen_message_keys_do_not_become_labels_or_long_log_lines(
    tmp_path: Path,
) -> None:
    content = "Tell me about the weather in a few sentences, please. " * 4
    with (
        router_before_pod(_POD, tmp_path) as (proc, _),
        httpx.Client(base_url=proc.url, timeout=10) as client,
    ):
        for turn in range(TURNS):
            key = f"k{turn}-".ljust(KEY_CHARS, "x")
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": content, key: 1}],
                "cache_salt": f"salt-{turn}",
            }
            got = client.post("/v1/chat/completions", json=body, headers={"x-session-id": "s"})
            assert got.status_code == 200, got.text
        metrics = client.get("/metrics").text
    series = [
        line
        for line in metrics.splitlines()
        if line.startswith("kvgate_router_prefix_breaks_total{")
    ]
    assert series == ['kvgate_router_prefix_breaks_total{field="other",pool="default/p"} 199.0']
    log = proc.log_text()
    assert log.count("prefix break") == TURNS - 1
    longest = max(len(line) for line in log.splitlines())
    assert longest < 1024, longest
    assert not proc.error_lines()
