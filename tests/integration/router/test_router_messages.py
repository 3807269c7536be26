"""Anthropic's Messages API (`/v1/messages`, as vLLM serves it for Claude Code and other Anthropic
clients) through the router, with the real `anthropic` client, over real HTTP to real
`kvgate sim serve` pods."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from tests.integration.router.conftest import pool_config, serve_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FILE = "def test():\n    assert parse(x) == 1\n" * 60
SYSTEM = "You are Claude Code. " + "Use the tools to read and edit files. " * 80
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"name": "read", "description": "read a file", "input_schema": SCHEMA}]


def _system(turn: int) -> list[dict[str, Any]]:
    """As Claude Code sends it: a billing header with a hash of each request, then the prompt
    with a cache marker."""
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cch={turn:08x};"},
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    """Claude Code marks the newest block for caching (the marker moves every turn)."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    return {**message, "content": blocks}


async def test_an_agents_turns_follow_its_prefix_and_usage_is_read(sim_pods):
    pods = sim_pods(3)
    async with serve_router(pool_config([p.url for p in pods])) as (url, _):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        async with client, httpx.AsyncClient() as http:
            messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing test"}]
            pods_used = []
            previous_prompt = 0
            for turn in range(4):
                raw = await client.messages.with_raw_response.create(
                    model="m", max_tokens=6, system=_system(turn), tools=TOOLS,
                    messages=[*messages[:-1], _marked(messages[-1])],
                )  # fmt: skip
                answer = await raw.parse()
                assert answer.type == "message" and answer.stop_reason == "max_tokens"
                pods_used.append(raw.headers["x-kvgate-endpoint"])
                if turn:
                    # The marker moved and the billing hash changed, the prefix did not: the
                    # router predicts (nearly) all of the last turn's prompt, the pod reads it.
                    predicted = int(raw.headers["x-kvgate-prefix-hit-tokens"])
                    assert predicted >= 0.9 * previous_prompt, (predicted, previous_prompt)
                    assert answer.usage.cache_read_input_tokens
                    assert answer.usage.cache_read_input_tokens > answer.usage.input_tokens
                previous_prompt = answer.usage.input_tokens + (
                    answer.usage.cache_read_input_tokens or 0
                )
                call = {"type": "tool_use", "id": f"t{turn}", "name": "read",
                        "input": {"path": f"f{turn}.py"}}  # fmt: skip
                messages += [
                    {"role": "assistant", "content": [*answer.model_dump()["content"], call]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}",
                                                  "content": FILE}]},
                ]  # fmt: skip
            assert len(set(pods_used)) == 1
            # A stream, with its usage counted by the router.
            async with client.messages.stream(
                model="m", max_tokens=5, system=_system(9), messages=messages[:1]
            ) as stream:
                text = "".join([t async for t in stream.text_stream])
                final = await stream.get_final_message()
            assert text and final.usage.output_tokens == 5
            metrics = (await http.get(url + "/metrics")).text
            assert "kvgate_router_cached_tokens_total{" in metrics
            count = await client.messages.count_tokens(
                model="m", system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
            )
            assert count.input_tokens > 0


async def test_errors_are_in_anthropics_shape(sim_pods):
    pods = sim_pods(1)
    async with serve_router(pool_config([pods[0].url])) as (url, _):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        async with client:
            with pytest.raises(anthropic.NotFoundError) as err:
                await client.messages.create(
                    model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
                )
            assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
            with pytest.raises(anthropic.BadRequestError) as bad:
                await client.messages.create(model="m", max_tokens=4, messages=[])
            assert bad.value.body["type"] == "error"  # type: ignore[index]


async def test_an_anthropic_clients_key_names_its_tenant(sim_pods):
    pods = sim_pods(1)
    tenants = {"tenants": [{"name": "a", "api_keys": [{"value": "key-a"}]}],
               "unknown_key": "reject"}  # fmt: skip
    async with serve_router(pool_config([pods[0].url], tenants=tenants)) as (url, _):
        mine = anthropic.AsyncAnthropic(base_url=url, api_key="key-a", max_retries=0)
        wrong = anthropic.AsyncAnthropic(base_url=url, api_key="key-x", max_retries=0)
        async with mine, wrong:
            hello = [{"role": "user", "content": "hi"}]
            answer = await mine.messages.create(model="m", max_tokens=2, messages=hello)
            assert answer.usage.output_tokens == 2
            with pytest.raises(anthropic.AuthenticationError) as err:
                await wrong.messages.create(model="m", max_tokens=2, messages=hello)
            assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
