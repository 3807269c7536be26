"""vLLM's pooling and tokenizer endpoints through the router, with the real `openai` client, over
real HTTP to real `kvgate sim serve` pods: embeddings are routed (by their input's prefix and
load), token counts relayed to one pod."""

from __future__ import annotations

import httpx
import openai
import pytest
from tests.integration.router.conftest import pool_config, serve_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DOCUMENT = "A long shared document chunk that every query embeds first. " * 40


async def test_embeddings_are_routed_by_their_input_and_token_counts_relayed(sim_pods):
    pods = sim_pods(3)
    async with serve_router(pool_config([p.url for p in pods])) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with client, httpx.AsyncClient() as http:
            first = await client.embeddings.with_raw_response.create(
                model="m", input=DOCUMENT + "query one"
            )
            again = await client.embeddings.with_raw_response.create(
                model="m", input=DOCUMENT + "query two"
            )
            vectors = first.parse().data
            assert len(vectors) == 1 and len(vectors[0].embedding) == 8
            assert again.parse().usage.prompt_tokens > 0
            assert again.headers["x-kvgate-endpoint"] == first.headers["x-kvgate-endpoint"]
            assert int(again.headers["x-kvgate-prefix-hit-tokens"]) > 0
            batch = await client.embeddings.create(model="m", input=["a b c", "d e f"])
            assert [v.index for v in batch.data] == [0, 1]
            counted = await http.post(url + "/tokenize", json={"model": "m", "prompt": "hello"})
            assert counted.status_code == 200 and counted.json()["count"] > 0
            assert counted.headers["x-kvgate-endpoint"]
            text = await http.post(
                url + "/detokenize", json={"model": "m", "tokens": counted.json()["tokens"]}
            )
            assert text.status_code == 200 and "prompt" in text.json()
            wrong = await http.post(url + "/v1/embeddings", json={"model": "x", "input": "hi"})
            assert wrong.status_code == 404
