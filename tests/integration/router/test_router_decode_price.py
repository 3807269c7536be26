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
    async with (
        serve_router(pool_config([p.url for p in pods])) as (url, _),
        httpx.AsyncClient(timeout=30) as http,
    ):

        async def expected_output(body: dict[str, object]) -> float:
            shown = await http.post(url + "/debug/route", json=body)
            assert shown.status_code == 200, shown.text
            if not shown.json()["expected_output_tokens"]:
                assert all(
                    c["decode_seconds"] == 0.0 for c in shown.json()["decision"]["candidates"]
                )
            ratios.append(shown.json()["output_ratio"])
            return float(shown.json()["expected_output_tokens"])

        ratios: list[float] = []

        question = {"model": "m", "prompt": "Why is the sky blue?"}
        assert await expected_output(question) == 0.0  # nothing learned yet
        long_answer = {**question, "max_tokens": 200, "min_tokens": 200, "ignore_eos": True}
        for _ in range(8):
            answered = await http.post(url + "/v1/completions", json=long_answer)
            assert answered.json()["usage"]["completion_tokens"] == 200
        assert await expected_output(question) == pytest.approx(200.0)
        assert await expected_output({**question, "max_tokens": 50}) == 50.0
        # the pool's answers are now short next to their prompts on average: not priced
        short = {"model": "m", "prompt": LONG_PROMPT, "max_tokens": 1}
        for _ in range(60):
            assert (await http.post(url + "/v1/completions", json=short)).is_success
        assert await expected_output(question) == 0.0
        # what decided it, shown beside it: nothing learned, long answers, then short ones
        assert ratios[0] == 0.0 and ratios[1] >= 0.3 > ratios[-1] > 0.0
