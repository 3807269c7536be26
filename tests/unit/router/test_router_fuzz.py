"""Nothing a client sends yields a 5xx: random and hostile request bodies, exact and approximate
keys. Seeded, so a failure reproduces."""

import json
import random
from pathlib import Path

import pytest
from tests.unit.router.fakes import FakePods

from kvgate.api.router_config import RouterConfig

TOKENIZER = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
VALUES = [
    None,
    True,
    0,
    -1,
    3.5,
    "",
    "x",
    "🙂" * 3,
    [],
    {},
    [1, 2],
    ["a"],
    [[1, 2]],
    {"a": 1},
    [None],
]


def _random_value(rng: random.Random, depth: int = 0):
    if depth > 2 or rng.random() < 0.5:
        return rng.choice(VALUES)
    if rng.random() < 0.5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["role", "content", "name", "tool_calls", "type", "text", "x"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _random_body(rng: random.Random) -> dict:
    if rng.random() < 0.5:  # a valid request, then maybe one hostile field
        body: dict = {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}]}
        if rng.random() < 0.5:
            body["prompt"] = list(range(rng.randint(1, 80)))
            del body["messages"]
        if rng.random() < 0.4:
            body[rng.choice(["stream", "tools", "user", "cache_salt", "stream_options"])] = (
                _random_value(rng)
            )
        return body
    body = {"model": rng.choice(["m", "m", "m", "other", 5, None])}
    if rng.random() < 0.7:
        messages = [
            {
                "role": rng.choice(["user", "system", "assistant", "tool", "bogus", 3]),
                "content": _random_value(rng),
            }
            for _ in range(rng.randint(0, 3))
        ]
        body["messages"] = messages if rng.random() < 0.8 else _random_value(rng)
    else:
        body["prompt"] = _random_value(rng)
    for key in ("stream", "stream_options", "tools", "cache_salt", "user", "max_tokens",
                "add_special_tokens", "chat_template_kwargs", "truncate_prompt_tokens"):  # fmt: skip
        if rng.random() < 0.2:
            body[key] = _random_value(rng)
    return body


@pytest.mark.parametrize("tokenizer", [None, TOKENIZER])
async def test_random_bodies_never_cause_a_5xx(router_app, tokenizer):
    config = RouterConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "model": "m",
                    "engine": {"tokenizer": {"path": tokenizer}},
                    "endpoints": {"static": [{"url": "http://pod0:1"}, {"url": "http://pod1:1"}]},
                }
            ],
            "sessions": {"header": "x-session-id"},
        }
    )
    client, runtime = await router_app(config, FakePods())
    rng = random.Random(1234)
    statuses: dict[int, int] = {}
    for i in range(150):
        body = _random_body(rng)
        path = rng.choice(["/v1/chat/completions", "/v1/completions", "/debug/route"])
        resp = await client.post(
            path,
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json", "x-session-id": str(i % 3)},
        )
        assert resp.status_code < 500, (body, resp.text)
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        if resp.status_code >= 400:
            assert set(resp.json()["error"]) >= {"message", "type", "code"}
    assert all(n == 0 for n in runtime.core.endpoint_load().values())
    assert statuses.get(200, 0) >= 10, statuses  # the generator also makes valid requests
