"""The routing core's copies of a long prefix hot on its holder (`core/prefix_copies.py`)."""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from typing import cast

import pytest
from tests.unit.loop_turns import other_task_turns
from tests.unit.router.fakes import make_config, routing_core

from kvgate.api.router_config import LimitsConfig
from kvgate.router.core import prefix_copies
from kvgate.router.core.hot_prefixes import HotPrefix
from kvgate.router.core.lifecycle import ClientRequest, RoutingCore
from kvgate.router.core.prefix_copies import MAX_COPIES_IN_FLIGHT
from kvgate.router.core.routing import RoutePlan
from kvgate.router.core.warmup_pods import WarmRequest
from kvgate.router.http import warmer as warmer_module
from kvgate.router.http.upstream import Upstream
from kvgate.router.http.warmer import (
    PAYLOAD_SLICE_CHARS,
    PAYLOAD_SLICE_TOKENS,
    Warmer,
    warm_payload,
)

DOCUMENT = list(range(10_000, 42_768))  # 32k tokens: seconds of prefill at the prior rate


def _body(question: int, document: list[int] = DOCUMENT) -> dict[str, object]:
    return {"model": "m", "prompt": document + [question] * 20, "max_tokens": 4}


async def _burst(core: RoutingCore, count: int, document: list[int] = DOCUMENT) -> list[RoutePlan]:
    """`count` requests on the document, each sent, prefilled and left decoding."""
    plans = []
    for i in range(count):
        request = ClientRequest(_body(i, document), {}, "completion")
        plan = await core.plan(request)
        attempt = core.sent(request, plan, streaming=True)
        core.first_byte(plan, attempt, streamed=True)
        plans.append(plan)
    return plans


async def test_a_burst_on_a_long_document_copies_it_to_an_idle_pod_and_stays_on_its_holder():
    now = [100.0]
    core, _ = await routing_core(make_config(3), now, 3)
    told: list[int] = []
    core.warm_requests_ready = lambda: told.append(1)
    plans = await _burst(core, 6)
    holder = plans[0].endpoint.id
    assert {p.endpoint.id for p in plans} == {holder}  # no client request recomputes it
    copies = core.warmup.take()
    assert len(copies) == 1 and told == [1]  # one copy, however many requests proposed it
    copy = copies[0]
    assert copy.copy and copy.endpoint_id != holder
    body = copy.body()
    assert body["prompt"] == DOCUMENT and body["max_tokens"] == 1 and body["model"] == "m"
    assert len(core.copies) == 1
    # the copy counts on its pod: one request in flight carrying the document's blocks
    assert core.endpoint_load()[copy.endpoint_id] == 1
    proposed = [p.decision.to_dict()["copy"] for p in plans if p.decision.copy is not None]
    assert proposed[0]["endpoint"] == copy.endpoint_id and proposed[0]["tokens"] == len(DOCUMENT)
    # the later proposals (to the third pod: the second holds it in flight) wait for that copy
    assert len(proposed) > 1
    skipped = core.metrics.child(core.metrics.prefix_copies, plans[0].pool.key, "skipped")
    assert skipped._value.get() >= 1

    core.warmup.request_done(copy, now[0], ok=True, prompt_tokens=len(DOCUMENT))
    assert len(core.copies) == 0 and core.endpoint_load()[copy.endpoint_id] == 0
    ok = core.metrics.child(core.metrics.prefix_copies, plans[0].pool.key, "ok")
    assert ok._value.get() == 1


async def test_copies_in_flight_are_bounded_per_pool_and_end_when_abandoned():
    now = [100.0]
    core, _ = await routing_core(make_config(6), now, 6)
    for k in range(MAX_COPIES_IN_FLIGHT + 1):
        document = list(range(100_000 * (k + 1), 100_000 * (k + 1) + 32_768))
        await _burst(core, 4, document)
    copies = core.warmup.take()
    assert len(copies) == MAX_COPIES_IN_FLIGHT
    for copy in copies:  # failed, timed out or abandoned: the pod's count ends all the same
        assert copy.deadline is not None and copy.deadline > now[0]
        core.warmup.request_done(copy, now[0], ok=False)
    assert len(core.copies) == 0
    assert all(load <= 4 for load in core.endpoint_load().values())


async def test_a_copy_is_sent_even_if_the_request_that_proposed_it_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client of the request whose decision proposed the copy leaves while the copy's
    blocks are recorded (a directory round trip): the copy, queued and counted on its pod, is
    still handed to the warmer, and ending it lets the router's queue move."""
    now = [100.0]
    core, _ = await routing_core(make_config(3), now, 3)
    told: list[int] = []
    core.warm_requests_ready = lambda: told.append(1)

    async def client_gone(*_args: object, **_kwargs: object) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr(core.learner, "copied", client_gone)
    with pytest.raises(asyncio.CancelledError):
        await _burst(core, 6)
    assert told == [1]
    [copy] = core.warmup.take()
    pumps: list[int] = []
    monkeypatch.setattr(core.flow, "pump", lambda: pumps.append(1))
    core.warmup.request_done(copy, now[0], ok=True, prompt_tokens=len(DOCUMENT))
    assert len(core.copies) == 0 and core.endpoint_load()[copy.endpoint_id] == 0
    assert pumps == [1]


async def test_a_prefix_with_an_id_beyond_every_vocabulary_is_routed_but_never_copied():
    """Ids of 2^32 and more fit no vocabulary (the pods answer 400) nor the 4 bytes a copy or a
    remembered hot prefix keeps an id in: such a prefix is neither, and its requests are routed
    as any other (before, the burst's copy raised OverflowError: a 500)."""
    now = [100.0]
    core, _ = await routing_core(make_config(3), now, 3)
    plans = await _burst(core, 6, [2**40, *DOCUMENT])
    assert len(plans) == 6
    assert any(p.decision.copy is not None for p in plans)  # proposed, as for any prefix
    assert core.warmup.take() == [] and len(core.copies) == 0


async def test_a_copy_waiting_for_a_send_slot_ends_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Copies share the warmer's `concurrency` slots with warm-ups, which may hold one for a
    minute: a copy still waiting for a slot at its deadline is abandoned there, and stops
    counting on its pod (before, it waited, counted, for as long as the slot stayed taken)."""
    monkeypatch.setattr(prefix_copies, "COPY_DEADLINE_SECONDS", 1.0)
    now = [100.0]
    config = make_config(6, warmup={"concurrency": 1})
    core, _ = await routing_core(config, now, 6)
    release = asyncio.Event()
    sent: list[str] = []

    async def send_warm(*_args: object, **_kwargs: object) -> dict[str, object]:
        sent.append("copy")
        await release.wait()
        return {"status": 200, "prompt_tokens": 1}

    monkeypatch.setattr(warmer_module, "send_warm", send_warm)
    warmer = Warmer(core, cast(Upstream, None), LimitsConfig, clock=time.monotonic)
    core.warm_requests_ready = warmer.dispatch
    now[0] = time.monotonic()  # the copies' deadlines in the warmer's clock
    for k in range(2):
        await _burst(core, 4, list(range(100_000 * (k + 1), 100_000 * (k + 1) + 32_768)))
    assert len(core.copies) == 2
    await asyncio.sleep(2.0)  # the first holds the only slot; the second's deadline passes
    assert sent == ["copy"] and len(core.copies) == 1
    release.set()
    await warmer.stop()
    assert len(core.copies) == 0


async def test_a_short_prefix_or_a_chat_prompt_keyed_approximately_is_never_copied():
    """A short shared prefix is copied by moving a request (`holder-load`'s hot bounds); a chat
    prompt without a tokenizer has no text the engine would tokenize the same (its template)."""
    now = [100.0]
    core, _ = await routing_core(make_config(3), now, 3)
    await _burst(core, 8, list(range(5000, 5512)))
    assert core.warmup.take() == []
    for i in range(8):
        content = "a long shared document " * 3000 + str(i)
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        request = ClientRequest(body, {}, "chat")
        core.sent(request, await core.plan(request), streaming=True)
    assert core.warmup.take() == []


async def test_a_text_prompt_keyed_approximately_is_copied_as_its_text_cut_before_a_space():
    """Without a tokenizer a completion's prompt is copied as text: the blocks' characters cut
    back before the last space between two letters, where a pre-token starts, so the pod
    computes the tokens the whole prompt has up to there; the history covers whole blocks."""
    now = [100.0]
    core, _ = await routing_core(make_config(3), now, 3)
    document = "a long shared document " * 3000
    plans = []
    for i in range(8):
        body = {"model": "m", "prompt": document + f"question {i}", "max_tokens": 4}
        request = ClientRequest(body, {}, "completion")
        plan = await core.plan(request)
        core.sent(request, plan, streaming=True)
        plans.append(plan)
    [copy] = core.warmup.take()
    text = copy.body()["prompt"]
    assert isinstance(text, str) and document.startswith(text)
    proposed = next(p.decision.copy for p in plans if p.decision.copy is not None)
    assert proposed is not None
    block_chars = plans[0].keys.block_chars
    assert proposed.blocks * block_chars - block_chars <= len(text) < proposed.blocks * block_chars
    assert document[len(text)] == " " and document[len(text) - 1].isalpha()
    payload = await warm_payload(copy)
    assert json.loads(payload) == copy.body()
    history = await core.router.indexes[plans[0].pool.key].lookup(plans[0].keys.block_keys)
    assert history[copy.endpoint_id] >= len(text) // block_chars  # later requests may add more


async def test_a_long_copy_is_encoded_with_the_event_loop_free_between_slices():
    """A copy carries up to a whole prompt's token ids (2^20 by default): its JSON body is
    encoded a slice at a time, the same JSON as `body()`, letting other tasks run between."""
    ids = array("I", range(4 * PAYLOAD_SLICE_TOKENS + 5))
    prefix = HotPrefix("default/p", "m", None, "salt", b"k", ids, 1.0, 0.0)
    request = WarmRequest("pod0:8000", "default/p", prefix, copy=True)
    async with other_task_turns() as turns:
        payload = await warm_payload(request)
    assert json.loads(payload) == request.body()
    assert turns() >= 4  # the loop ran other tasks between the five slices
    # a text copy (approximate keys): escapes, accents and astral characters across slices
    text = 'mot \u00e9t\u00e9 \U0001f642 "quoted"\n' * PAYLOAD_SLICE_CHARS
    prefix = HotPrefix("default/p", "m", None, None, b"k", None, 1.0, 0.0, text=text)
    request = WarmRequest("pod0:8000", "default/p", prefix, copy=True)
    async with other_task_turns() as turns:
        payload = await warm_payload(request)
    assert json.loads(payload) == request.body() and request.body()["prompt"] == text
    assert turns() >= 4
