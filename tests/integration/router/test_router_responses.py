"""OpenAI's Responses API through the router, with the real `openai` client, over real HTTP.

Three real `kvgate sim serve` pods store each answer in their own memory as vLLM does
(`VLLM_ENABLE_RESPONSES_API_STORE=1`): a follow-up (`previous_response_id`) or a retrieval that
reaches another pod is that pod's 404. Two router replicas (two apps on their own ports, each
with its own state and no shared directory) serve the same pods: a conversation started through
one continues through the other, which proves the pod is named by the id, not remembered.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from tests.integration.router.conftest import pool_config, serve_router

from kvgate.promtext import sum_samples
from kvgate.router.core.response_ids import mint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

INSTRUCTIONS = "You are a coding agent. " + "Follow the repository's conventions. " * 60


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_a_conversation_continues_on_the_pod_that_stored_it_through_any_replica(sim_pods):
    pods = sim_pods(3)
    urls = [p.url for p in pods]
    async with (
        serve_router(pool_config(urls)) as (url_a, _),
        serve_router(pool_config(urls)) as (url_b, _),
        _client(url_a) as a,
        _client(url_b) as b,
    ):
        for chain in range(6):
            answer = await a.responses.create(
                model="m",
                instructions=INSTRUCTIONS,
                input=f"conversation {chain}: list the files",
                max_output_tokens=8,
            )
            # At `max_output_tokens` vLLM reports the answer `incomplete`.
            assert answer.id.startswith("resp_kg") and answer.status == "incomplete"
            assert answer.usage is not None and answer.usage.input_tokens > 0
            for turn in range(2):
                replica = b if turn % 2 == 0 else a
                answer = await replica.responses.create(
                    model="m",
                    input=f"turn {turn}: now open the first one",
                    previous_response_id=answer.id,
                    max_output_tokens=8,
                )
                assert answer.status == "incomplete"
                assert answer.previous_response_id is not None
            # Retrieval and cancel, through the other replica, reach the pod that stored it.
            stored = await b.responses.retrieve(answer.id)
            assert stored.id == answer.id and stored.output_text == answer.output_text
            with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous"):
                await a.responses.cancel(answer.id)


async def test_a_stream_passes_whole_and_its_usage_is_counted(sim_pods):
    pods = sim_pods(2)
    async with serve_router(pool_config([p.url for p in pods])) as (url, _), _client(url) as client:
        events: list[Any] = []
        stream = await client.responses.create(
            model="m", instructions=INSTRUCTIONS, input="hello", max_output_tokens=6, stream=True
        )
        async for event in stream:
            events.append(event)
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in kinds and kinds[-1] == "response.incomplete"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = events[-1].response
        assert done.usage is not None and done.usage.output_tokens == 6
        # A follow-up of the streamed answer, on its pod.
        again = await client.responses.create(
            model="m", input="and again", previous_response_id=done.id
        )
        assert again.status == "completed"  # no limit: the answer ends on its own
        # An agent that resends its items instead: routed by their prefix to the same pod,
        # whose cache holds it.
        items: list[Any] = [
            {"role": "user", "content": "hello"},
            *[item.model_dump(exclude_none=True) for item in done.output],
            {"role": "user", "content": "continue"},
        ]
        raw = await client.responses.with_raw_response.create(
            model="m", instructions=INSTRUCTIONS, input=items, max_output_tokens=4, store=False
        )
        resent = raw.parse()
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(url + "/metrics")).text
            probe = await http.post(
                url + "/debug/route",
                json={"model": "m", "instructions": INSTRUCTIONS, "input": items},
            )
        assert int(raw.headers["x-kvgate-prefix-hit-tokens"]) > 0
        assert resent.usage is not None and resent.usage.input_tokens_details.cached_tokens > 0
        assert probe.json()["decision"]["endpoint"] == raw.headers["x-kvgate-endpoint"]
        counted = sum_samples(metrics, ["kvgate_router_cached_tokens_total"])
        assert counted["kvgate_router_cached_tokens_total"] > 0


async def test_ids_the_router_cannot_place_are_a_clear_404(sim_pods):
    pods = sim_pods(1)
    async with serve_router(pool_config([pods[0].url])) as (url, _), _client(url) as client:
        gone = mint("10.0.0.9:8000")  # a pod that has left the pool
        with pytest.raises(openai.NotFoundError) as err:
            await client.responses.create(model="m", input="hi", previous_response_id=gone)
        assert err.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
        for unknown in (gone, "resp_0123", "x" * 5000):
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(unknown)
        async with httpx.AsyncClient() as http:
            wrong = await http.delete(url + f"/v1/responses/{gone}")
            assert wrong.status_code == 405
            live = await client.responses.create(model="m", input="hi", max_output_tokens=2)
            bad = await http.get(url + f"/v1/responses/{live.id}?starting_after=x")
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"
            ok = await http.get(url + f"/v1/responses/{live.id}?stream=false&other=1")
            assert ok.status_code == 200 and ok.json()["id"] == live.id
            empty = await http.post(url + "/v1/responses", json={"model": "m", "input": []})
            assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"
            # An id of the router's form would let vLLM store over that response: refused.
            taken = {"model": "m", "input": "hi", "request_id": live.id}
            refused = await http.post(url + "/v1/responses", json=taken)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "request_id"
            assert (await client.responses.retrieve(live.id)).output_text == live.output_text


async def test_with_tenants_a_response_is_reachable_only_with_its_tenants_key(sim_pods):
    pods = sim_pods(2)
    tenants = {
        "tenants": [
            {"name": "a", "api_keys": [{"value": "key-a"}]},
            {"name": "b", "api_keys": [{"value": "key-b"}]},
        ],
        "unknown_key": "reject",
    }
    config = pool_config([p.url for p in pods], tenants=tenants)
    async with serve_router(config) as (url, _):
        a = openai.AsyncOpenAI(base_url=url + "/v1", api_key="key-a", max_retries=0)
        b = openai.AsyncOpenAI(base_url=url + "/v1", api_key="key-b", max_retries=0)
        nobody = openai.AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        async with a, b, nobody:
            written = await a.responses.create(model="m", input="secret plan", max_output_tokens=4)
            assert (await a.responses.retrieve(written.id)).id == written.id
            follow_up = await a.responses.create(
                model="m", input="more", previous_response_id=written.id, max_output_tokens=2
            )
            assert follow_up.status == "incomplete"
            with pytest.raises(openai.NotFoundError):
                await b.responses.retrieve(written.id)
            with pytest.raises(openai.NotFoundError):
                await b.responses.cancel(written.id)
            with pytest.raises(openai.NotFoundError):
                await b.responses.create(
                    model="m", input="x", previous_response_id=written.id, max_output_tokens=2
                )
            with pytest.raises(openai.AuthenticationError):
                await nobody.responses.retrieve(written.id)
