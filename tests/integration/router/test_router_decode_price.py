"""The decode price over real HTTP to real `kvgate sim serve` pods: the router learns each pool's
answers from the pods' own usage, and prices the decode only where they are long next to their
prompts."""

from __future__ import annotations

import httpx
import pytest
from tests.integration.router.conftest import pool_config, serve_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LONG_PROMPT = "A long document the question is about, sentence after sentence. " * 40


async def test_the_decode_price_is_asked_for_only_where_answers_are_long(sim_pods):
    """The router learns each pool's answers from the pods' usage: answers long next to their
    prompts (a reasoning model's) turn the decode price on, and `/debug/route` says with what
    length; once the answers are short next to their prompts, it is off again."""
    pods = sim_pods(2)
    async with serve_router(pool_config([p.url for p in pods])) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            question = {"model": "m", "prompt": "Why is the sky blue?"}
            shown = await http.post("/debug/route", json=question)
            assert shown.json()["expected_output_tokens"] == 0.0  # nothing learned yet
            long_answer = {**question, "max_tokens": 200, "min_tokens": 200, "ignore_eos": True}
            for _ in range(8):
                answered = await http.post("/v1/completions", json=long_answer)
                assert answered.json()["usage"]["completion_tokens"] == 200
            shown = (await http.post("/debug/route", json=question)).json()
            assert shown["expected_output_tokens"] == pytest.approx(200.0)
            capped = {**question, "max_tokens": 50}
            assert (await http.post("/debug/route", json=capped)).json()[
                "expected_output_tokens"
            ] == 50.0
            # the pool's answers are now short next to their prompts on average: not priced
            for _ in range(60):
                short = {"model": "m", "prompt": LONG_PROMPT, "max_tokens": 1}
                assert (await http.post("/v1/completions", json=short)).is_success
            shown = (await http.post("/debug/route", json=question)).json()
            assert shown["expected_output_tokens"] == 0.0
            assert all(c["decode_seconds"] == 0.0 for c in shown["decision"]["candidates"])
