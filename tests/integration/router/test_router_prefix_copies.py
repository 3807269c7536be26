"""A long document hot on its holder is copied by the router itself, no client waiting for it.

Real `kvgate router --config` process, real `kvgate sim serve` pods (the test tokenizer: exact
keys). A burst of streaming requests on one shared document piles onto the pod that computed it;
the router sends the document alone (`max_tokens: 1`) to another pod, every client request is
answered, and that pod then holds the document: a request sent to it directly hits it.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.router.router_process import TOKENIZER, RouterProcess, router_config, text_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DOCUMENT = text_of(6000, random.Random(7))
COPIES = re.compile(r'kvgate_router_prefix_copies_total\{pool="default/p",result="ok"\} (\S+)')


def _chat(question: str, max_tokens: int = 30) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": DOCUMENT},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _ask(client: httpx.AsyncClient, question: str) -> str:
    async with client.stream("POST", "/v1/chat/completions", json=_chat(question)) as answer:
        assert answer.status_code == 200, await answer.aread()
        body = (await answer.aread()).decode()
    assert "data: [DONE]" in body, body[-300:]
    return answer.headers["x-kvgate-endpoint"]


async def _complete(client: httpx.AsyncClient, question: str) -> str:
    body = {"model": "m", "prompt": DOCUMENT + "\n\n" + question, "max_tokens": 30, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        text = (await answer.aread()).decode()
    assert "data: [DONE]" in text, text[-300:]
    return answer.headers["x-kvgate-endpoint"]


async def _copied_then_held(
    sim_pods: Callable[..., list[Any]],
    tmp_path: Path,
    ask: Callable[[httpx.AsyncClient, str], Awaitable[str]],
    direct: tuple[str, dict[str, object]],
    *,
    tokenizer: bool,
) -> None:
    """A burst of `ask`s on the document through a real router (exact keys with the test
    tokenizer, else approximate), a copy answered, then a pod other than the holder hits the
    document for the `direct` request (path, body) sent straight to it."""
    pods = sim_pods(3, "--tokenizer", TOKENIZER, "--sim-time-scale", "1")
    config = router_config([p.url for p in pods])
    if not tokenizer:
        del config["pools"][0]["engine"]["tokenizer"]
    # every hot prefix is "long" here: the rule is the one a shared document meets in production
    config["policy"] = {"seed": 1, "params": {"holder_load": {"hot_max_copy_seconds": 0.0}}}
    router = RouterProcess(config, tmp_path)
    try:
        await router.wait_ready()
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            holder = await ask(client, "first question?")
            chosen = await asyncio.gather(*(ask(client, f"question {i}?") for i in range(8)))
            assert holder in chosen
            deadline = time.monotonic() + 30
            while not (found := COPIES.search((await client.get("/metrics")).text)):
                assert time.monotonic() < deadline, "no copy was answered"
                await asyncio.sleep(0.1)
            assert float(found.group(1)) >= 1
        cached = {}
        for pod in pods:
            if holder.endswith(pod.url.split("//")[1]):
                continue
            async with httpx.AsyncClient(base_url=pod.url, timeout=60) as to_pod:
                usage = (await to_pod.post(direct[0], json=direct[1])).json()["usage"]
            cached[pod.url] = (
                usage["prompt_tokens_details"]["cached_tokens"],
                usage["prompt_tokens"],
            )
        assert any(hit >= 0.8 * total for hit, total in cached.values()), cached
    finally:
        router.stop()
    assert "Traceback" not in router.log()


async def test_a_burst_on_a_long_document_is_copied_to_another_pod_by_the_router(
    sim_pods, tmp_path
):
    direct = {**_chat("straight to the pod?", 1), "stream": False}
    del direct["stream_options"]
    await _copied_then_held(
        sim_pods, tmp_path, _ask, ("/v1/chat/completions", direct), tokenizer=True
    )


async def test_without_a_tokenizer_a_text_prompt_is_copied_as_its_text(sim_pods, tmp_path):
    """Approximate keys (no tokenizer in the router): the copy is the document's text, cut
    before a space, and the pod it went to then hits the document for a request sent to it."""
    direct = {"model": "m", "prompt": DOCUMENT + "\n\nstraight?", "max_tokens": 1}
    await _copied_then_held(
        sim_pods, tmp_path, _complete, ("/v1/completions", direct), tokenizer=False
    )
