"""Load generator: open-loop arrivals and closed-loop sessions over streaming HTTP.

Every request is sent with ``stream: true`` and ``stream_options.include_usage`` (a Responses
or Anthropic Messages API request without it: its stream always ends with the usage) so that
one response gives both timings and the pod's own token accounting:

- TTFT = arrival of the first SSE chunk carrying generated text - send time (with vLLM that is
  the first byte of the body; a chat stream's opening role-only chunk does not count);
  end-to-end = last byte - send time; TPOT = (end - first byte) / (tokens - 1);
- ``usage.prompt_tokens`` and ``usage.prompt_tokens_details.cached_tokens`` from the final chunk
  (the hit rate is computed from these, i.e. from the pods, not from what the router predicted);
- the pod chosen, from the ``x-kvgate-endpoint`` response header where the target sets it.

Open loop: one scheduler task sleeps until each request's ``arrival_s`` and starts it as its own
task, so a slow answer never delays later arrivals. Closed loop: one task per session sends a
turn, waits for the whole answer, pauses ``think_time_s``, sends the next turn.

The generator checks itself: ``send lag`` (actual - scheduled send time) for every request and
``loop lag`` from a 50 ms ticker (its maximum, and when each stall over 0.25 s happened). Both are
reported; a large lag means the client, not the target, set the pace, and the run says so instead
of reporting the client's delay as the router's. While it runs, the objects that exist when it
starts (the workload: with long prompts, millions of token ids) are frozen out of the garbage
collector (``gc.freeze``), whose full passes over them otherwise stall the loop for 0.1-0.2 s.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from kvgate.bench.records import LATE_SEND_S, LOOP_STALL_S, GeneratorHealth, RequestRecord
from kvgate.bench.workload import (
    MESSAGES,
    PREVIOUS_RESPONSE,
    RESPONSES,
    BenchRequest,
    Session,
    Workload,
)

CLASS_HEADER = "x-kvgate-class"
SESSION_HEADER = "x-session-id"
ENDPOINT_HEADER = "x-kvgate-endpoint"
TICK_S = 0.05

ProgressCallback = Callable[[RequestRecord], None]
#: Idle connections are dropped before servers drop them (uvicorn: 5 s), or a request sent on a
#: connection the server is closing fails with a ReadError that is nobody's fault.
KEEPALIVE_S = 2.0


def http_client(request_timeout_s: float) -> httpx.AsyncClient:
    """The HTTP client a generator sends with: no connection limit, idle ones kept briefly."""
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_S
    )
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(request_timeout_s, connect=10.0))


def parse_usage(line: str) -> dict[str, Any] | None:
    """The ``usage`` object of one SSE ``data:`` line, if it carries one."""
    if not line.startswith("data:") or '"prompt_tokens"' not in line:
        return None
    payload = line[5:].strip()
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        return None
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    return usage if isinstance(usage, dict) else None


# A JSON string value of a token field that is not empty: `"text": "x`, `"content":"x`, a
# Responses API stream's `"delta":"x` (its opening events echo the request, with no such field),
# an Anthropic thinking block's `"thinking":"x`.
_TEXT_VALUE = re.compile(rb'"(?:text|content|reasoning_content|delta|thinking)"\s*:\s*"(?!")')
# A Responses or Messages stream's end, and its error event (by its event line or its type).
_TERMINAL = re.compile(
    rb'(?:event: ?|"type"\s*:\s*")(?:message_stop|response\.completed|response\.incomplete)\b'
)
_ERROR_EVENT = re.compile(rb"(?:^|\n)event: ?(?:error|response\.failed)\b")
# A Responses answer's id, in its first event (`response.created`).
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,128})"')
# The last `usage` object of a stream's tail (a Responses stream's last event holds the whole
# response, which may be longer than the tail, but `usage` is among its last fields).
_USAGE = re.compile(rb'(?<!\\)"usage"\s*:\s*(?=\{)')
_TAIL_BYTES = 8192


def carries_text(line: str) -> bool:
    """Whether an SSE line carries generated text (the first one marks the first token).

    A chat stream may open with a chunk holding only the assistant role and empty content; that
    chunk is not a token (vLLM's own benchmark skips it too).
    """
    if not line.startswith("data:") or line.startswith("data: [DONE]"):
        return False
    try:
        chunk = json.loads(line[5:])
    except json.JSONDecodeError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not choices:
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content"))


def last_usage(tail: bytes) -> dict[str, Any] | None:
    """The usage of a Responses API or Anthropic Messages stream, from its tail (the last
    `usage` object in it)."""
    starts = [match.end() for match in _USAGE.finditer(tail)]
    if not starts:
        return None
    try:
        usage, _ = json.JSONDecoder().raw_decode(tail[starts[-1] :].decode(errors="replace"))
    except json.JSONDecodeError:
        return None
    return usage if isinstance(usage, dict) else None


def apply_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    """Chat and completions name the counts `prompt_tokens`..., the Responses API
    `input_tokens`..., Anthropic's `input_tokens` (uncached) and `cache_read_input_tokens`."""
    names = ("prompt", "completion") if "prompt_tokens" in usage else ("input", "output")
    record.prompt_tokens = int(usage.get(f"{names[0]}_tokens") or 0)
    record.completion_tokens = int(usage.get(f"{names[1]}_tokens") or 0)
    details = usage.get(f"{names[0]}_tokens_details") or {}
    record.cached_tokens = (
        int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    )
    if "cache_read_input_tokens" in usage:
        record.cached_tokens = int(usage.get("cache_read_input_tokens") or 0)
        created = int(usage.get("cache_creation_input_tokens") or 0)
        record.prompt_tokens += record.cached_tokens + created


class LoadGenerator:
    """Sends one workload to one OpenAI-compatible base URL and records every request."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        model: str,
        *,
        duration_s: float | None = None,
        request_timeout_s: float = 300.0,
        progress: ProgressCallback | None = None,
        client_index: int = 0,
    ) -> None:
        self._client = client
        self._client_index = client_index
        self._base_url = base_url.rstrip("/")
        self._model = model
        self._duration_s = duration_s
        self._timeout = request_timeout_s
        self._progress = progress
        self._records: list[RequestRecord] = []
        self._loop_lag_s = 0.0
        self._stalls: list[tuple[float, float]] = []
        self._t0 = 0.0

    def _now(self) -> float:
        return asyncio.get_running_loop().time() - self._t0

    def _in_window(self, at_s: float) -> bool:
        return self._duration_s is None or at_s <= self._duration_s

    async def run(
        self, workload: Workload, *, start_at: float | None = None
    ) -> tuple[list[RequestRecord], GeneratorHealth]:
        """Replay ``workload``; its clock starts now, or at the wall-clock instant ``start_at``
        (``time.time()``), which several generator processes share (``clients.py``)."""
        self._records = []
        self._loop_lag_s = 0.0
        self._stalls = []
        loop = asyncio.get_running_loop()
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        self._t0 = loop.time()
        ticker = asyncio.create_task(self._tick(), name="loadgen-ticker")
        gc.freeze()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._open_loop(workload.requests))
                for session in workload.sessions:
                    group.create_task(self._session(session))
        finally:
            gc.unfreeze()
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        return list(self._records), self._health()

    def _health(self) -> GeneratorHealth:
        lags = [r.lag_s for r in self._records]
        return GeneratorHealth(
            max_send_lag_s=max(lags, default=0.0),
            mean_send_lag_s=sum(lags) / len(lags) if lags else 0.0,
            max_loop_lag_s=self._loop_lag_s,
            late_sends=sum(1 for lag in lags if lag > LATE_SEND_S),
            loop_stalls=list(self._stalls),
        )

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            lag = loop.time() - before - TICK_S
            self._loop_lag_s = max(self._loop_lag_s, lag)
            if lag > LOOP_STALL_S:
                self._stalls.append((self._now(), lag))

    async def _sleep_until(self, at_s: float) -> None:
        delay = at_s - self._now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _open_loop(self, requests: tuple[BenchRequest, ...]) -> None:
        async with asyncio.TaskGroup() as group:
            for request in sorted(requests, key=lambda r: r.arrival_s):
                if not self._in_window(request.arrival_s):
                    break
                await self._sleep_until(request.arrival_s)
                group.create_task(self.send(request, request.arrival_s))

    async def _session(self, session: Session) -> None:
        if not self._in_window(session.start_s):
            return
        await self._sleep_until(session.start_s)
        due = session.start_s
        previous: str | None = None
        for turn in session.turns:
            if not self._in_window(due):
                return
            if turn.body.get("previous_response_id") == PREVIOUS_RESPONSE:
                turn = replace(turn, body={**turn.body, "previous_response_id": previous})
            record = await self.send(turn, due)
            if not record.ok:
                return  # an agent whose call failed stops; the error is in the record
            previous = record.response_id
            due = self._now() + turn.think_time_s
            await self._sleep_until(due)

    def _headers(self, request: BenchRequest) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if request.request_class != "online":
            headers[CLASS_HEADER] = request.request_class
        if request.session_id is not None:
            headers[SESSION_HEADER] = request.session_id
        if request.api_key is not None:
            headers["authorization"] = f"Bearer {request.api_key}"
        return headers

    async def send(self, request: BenchRequest, scheduled_s: float) -> RequestRecord:
        body = dict(request.body)
        body["model"] = self._model
        body["stream"] = True
        if request.path not in (RESPONSES, MESSAGES):  # their streams end with the usage
            body["stream_options"] = {"include_usage": True}
        record = RequestRecord(
            request_id=request.request_id,
            request_class=request.request_class,
            session_id=request.session_id,
            scheduled_s=scheduled_s,
            sent_s=self._now(),
            client=self._client_index,
        )
        try:
            async with asyncio.timeout(self._timeout):
                await self._stream(request.path, body, self._headers(request), record)
        except TimeoutError:
            record.error = f"timed out after {self._timeout:g}s"
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.end_s = self._now() if record.end_s is None else record.end_s
        self._records.append(record)
        if self._progress is not None:
            self._progress(record)
        return record

    async def _stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str], record: RequestRecord
    ) -> None:
        url = self._base_url + path
        async with self._client.stream("POST", url, json=body, headers=headers) as response:
            record.status = response.status_code
            record.endpoint = response.headers.get(ENDPOINT_HEADER)
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            # Raw chunks, not lines: a regex per chunk until the first token, then only a
            # bounded tail is kept; the usage and any error are read from it at the end.
            tail = b""
            ended = False  # a Responses or Messages stream's terminal event was seen
            async for chunk in response.aiter_bytes():
                if record.first_byte_s is None and _TEXT_VALUE.search(chunk):
                    record.first_byte_s = self._now()
                if path == RESPONSES and record.response_id is None:
                    found = _RESPONSE_ID.search(tail[-64:] + chunk)
                    record.response_id = found.group(1).decode() if found else None
                ended = ended or _TERMINAL.search(tail[-64:] + chunk) is not None
                tail = (tail + chunk)[-_TAIL_BYTES:]
            record.end_s = self._now()
            if path in (RESPONSES, MESSAGES):
                usage = last_usage(tail)
                if _ERROR_EVENT.search(tail) is not None:
                    record.error = tail[-200:].decode(errors="replace")
                elif not ended or usage is None:
                    record.error = "the stream ended before its terminal event"
                else:
                    apply_usage(record, usage)
                return
            for raw_line in reversed(tail.split(b"\n")):
                line = raw_line.decode(errors="replace").strip()
                usage = parse_usage(line)
                if usage is not None:
                    apply_usage(record, usage)
                    break
                if line.startswith("data:") and '"error"' in line:
                    record.error = line[5:].strip()[:200]
                    break
