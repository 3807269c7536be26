"""Mooncake-format trace replay.

A trace is JSONL, one request per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2, 3]}

``timestamp`` is in milliseconds from the start of the trace; each entry of ``hash_ids`` stands for
one block of :data:`MOONCAKE_BLOCK_TOKENS` prompt tokens, and the ids are chained on their prefix:
two requests whose ``hash_ids`` start with the same *k* ids share their first ``k * 512`` tokens.

Other traces in this shape are read too. Alibaba's Bailian traces (Qwen usage traces) carry
``chat_id`` and ``parent_chat_id``, timestamps in seconds and 16-token blocks: a trace whose
first row has a ``chat_id`` is read as one (``trace_format``), and its turns carry the id of
their conversation's first turn as their session id (sent as the router's session header). A
row's ``session_id`` (aiperf and Dynamo traces) is its session id. How many tokens a hash id
stands for is read from the trace itself unless ``block_tokens`` says: the power of two for
which the most rows have exactly ``ceil(input_length / block)`` ids (converted traces use 16 to
512). A trace with rows without a ``timestamp`` (multi-turn traces written for aiperf or Dynamo)
is replayed in closed loop: each session's turns in trace order, one after the answer to the
other plus the turn's ``delay`` (ms), each session from its first row's timestamp (0 without
one). A row may carry its prompt itself instead of ``input_length`` and ``hash_ids``, as aiperf's
traces do: ``messages`` (an OpenAI chat, sent as is to ``/v1/chat/completions`` with the row's
``tools``) or ``text_input`` (a completion prompt); its tokens are what the pods' tokenizer makes
of it (:func:`body_tokenizer`).

Replay: each hash id maps to a deterministic block of token ids drawn from a PRNG seeded by
(trace seed, hash id), so the same id is the same tokens in every request and every run. The
prompt is the concatenation of its blocks cut to ``input_length`` (padded with request-unique
tokens if the ids cover fewer tokens). Arrival = the timestamp in seconds / ``speedup``, plus
uniform jitter in ``[-jitter_s, +jitter_s]`` (clamped at 0). ``skip_requests`` starts the replay
further into the file (its clock starts at the first row replayed), so that a policy tuned on
one window of a trace can be checked on others; ``max_requests`` and ``max_duration_s`` cut the
replay short; ``max_input_len`` caps prompt length (keeping the leading blocks).
"""

from __future__ import annotations

import json
import math
import random
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvgate.bench.workload import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    BenchRequest,
    Session,
    Workload,
    completion_request,
    exact_output_fields,
    random_tokens,
)

MOONCAKE_BLOCK_TOKENS = 512
BLOCK_TOKEN_CHOICES = tuple(2**k for k in range(13))
"""The block sizes a trace's hash ids are matched against (1 to 4,096 tokens)."""

TraceFormat = Literal["auto", "mooncake", "bailian"]


class TraceRow(BaseModel):
    """One line of a Mooncake-format trace."""

    model_config = ConfigDict(extra="ignore")

    timestamp: float | None = Field(
        default=None, ge=0, description="since the trace start: ms, or s in Bailian traces"
    )
    input_length: int | None = Field(default=None, ge=1)
    output_length: int | None = Field(
        default=None, ge=0, description="tokens answered; 0 or none: one (aiperf's may omit it)"
    )
    hash_ids: list[int] = Field(default_factory=list)
    messages: list[dict[str, Any]] | None = Field(
        default=None, min_length=1, description="aiperf traces: the chat sent, as is"
    )
    tools: list[dict[str, Any]] | None = Field(default=None, description="sent with `messages`")
    text_input: str | None = Field(default=None, description="aiperf traces: a completion prompt")
    session_id: str | int | None = Field(default=None, description="aiperf and Dynamo traces")
    chat_id: int | None = Field(default=None, description="Bailian traces: this turn")
    parent_chat_id: int | None = Field(
        default=None, description="Bailian traces: the turn this one follows (-1: none)"
    )
    delay: float | None = Field(
        default=None, ge=0, description="ms after the session's previous answer (closed loop)"
    )

    @model_validator(mode="before")
    @classmethod
    def _readable(cls, data: Any) -> Any:
        """Forms of aiperf's that are not one request per row, refused by name (read as rows,
        they were refused for a missing field, or replayed without their history)."""
        if isinstance(data, dict):
            if "turns" in data:
                raise ValueError(
                    "a session with `turns` (aiperf's multi_turn file) is not read: write one "
                    "row per turn with the session's `session_id`"
                )
            if data.get("message_mode") not in (None, "full"):
                raise ValueError(
                    f"message_mode {data['message_mode']!r} is not read: each row must carry "
                    "the whole chat it sends (message_mode full)"
                )
        return data

    @model_validator(mode="after")
    def _has_a_prompt(self) -> TraceRow:
        if self.input_length is None and self.messages is None and self.text_input is None:
            raise ValueError("a row needs input_length (with hash_ids), messages or text_input")
        return self

    @property
    def answer_tokens(self) -> int:
        """What the row's answer is sent for: its `output_length`, at least one token."""
        return max(1, self.output_length or 0)

    @property
    def has_text(self) -> bool:
        """The row carries its prompt (``messages`` or ``text_input``), not token counts."""
        return self.messages is not None or self.text_input is not None


# Token ids of a request body (`path`, `body`) as the pods tokenize it.
BodyTokenizer = Callable[[str, Mapping[str, Any]], list[int]]


def body_tokenizer(tokenizer: str | None = None) -> BodyTokenizer:
    """How the fleet's pods tokenize a chat or completion body: the ``tokenizer`` folder's
    tokenizer and chat template, or the simulator's own codec (4 characters a token; it does
    not render ``tools``)."""
    from kvgate.sim.text import load_codec

    codec = load_codec(tokenizer, "sim-model", 32000)

    def tokenize(path: str, body: Mapping[str, Any]) -> list[int]:
        if path == CHAT_COMPLETIONS:
            return codec.chat_token_ids(body)
        return codec.completion_token_ids(body)[0]

    return tokenize


class TraceParams(BaseModel):
    """How to replay a Mooncake trace."""

    model_config = ConfigDict(extra="forbid")

    speedup: float = Field(default=1.0, gt=0, description="divide every timestamp by this")
    jitter_s: float = Field(default=0.0, ge=0, description="uniform jitter added to each arrival")
    skip_requests: int = Field(
        default=0, ge=0, description="start at this row (0-based); earlier rows are not sent"
    )
    max_requests: int | None = Field(
        default=None, ge=1, description="replay at most this many rows"
    )
    max_duration_s: float | None = Field(default=None, gt=0, description="drop rows arriving later")
    max_input_len: int | None = Field(default=None, ge=1, description="cut longer prompts")
    max_output_len: int | None = Field(default=None, ge=1, description="cut longer outputs")
    vocab_size: int = Field(
        default=32000, ge=2000, le=1 << 32, description="token ids are drawn below this"
    )
    seed: int = Field(default=0, description="seeds the hash-id blocks and the jitter")
    trace_format: TraceFormat = Field(
        default="auto",
        description="bailian: timestamps in seconds, sessions by chat_id; auto: bailian when "
        "the first row has a chat_id, else mooncake",
    )
    block_tokens: int | None = Field(
        default=None,
        ge=1,
        le=BLOCK_TOKEN_CHOICES[-1],
        description="prompt tokens per hash id; None: the block size the rows agree on",
    )


class TraceError(ValueError):
    """A trace line that is not valid Mooncake JSON."""


def read_trace(
    lines: Iterable[str], source: str = "trace", max_rows: int | None = None
) -> list[TraceRow]:
    """Parse JSONL lines (blank lines skipped), the first ``max_rows`` rows at most (a replay of
    a window of a large trace holds only what it reads); errors name the line."""
    rows: list[TraceRow] = []
    for number, line in enumerate(lines, start=1):
        if max_rows is not None and len(rows) >= max_rows:
            break
        if not line.strip():
            continue
        try:
            rows.append(TraceRow.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise TraceError(f"{source}:{number}: not a Mooncake trace row: {exc}") from exc
    return rows


def read_trace_file(path: Path, max_rows: int | None = None) -> list[TraceRow]:
    with path.open(encoding="utf-8-sig") as handle:  # a BOM, as Windows editors write one
        return read_trace(handle, source=str(path), max_rows=max_rows)


def rows_needed(params: TraceParams) -> int | None:
    """How many rows of the trace a replay with these parameters uses (None: all of them):
    ``skip_requests`` + ``max_requests``, unless ``max_duration_s`` may drop some of those."""
    if params.max_requests is None or params.max_duration_s is not None:
        return None
    return params.skip_requests + params.max_requests


def infer_block_tokens(rows: Iterable[TraceRow]) -> int:
    """The tokens per hash id that the rows agree on: the power of two for which the most rows
    carry exactly ``ceil(input_length / block)`` ids (512, Mooncake's, on a tie or with no ids)."""
    votes: Counter[int] = Counter()
    for row in rows:
        if row.hash_ids and row.input_length is not None:
            ids = len(row.hash_ids)
            votes.update(b for b in BLOCK_TOKEN_CHOICES if math.ceil(row.input_length / b) == ids)
    if not votes:
        return MOONCAKE_BLOCK_TOKENS
    return max(votes, key=lambda b: (votes[b], b == MOONCAKE_BLOCK_TOKENS))


def is_bailian(rows: Sequence[TraceRow], trace_format: TraceFormat) -> bool:
    """Whether the (non-empty) rows are read as a Bailian trace (seconds, sessions by
    ``chat_id``)."""
    if trace_format == "auto":
        return rows[0].chat_id is not None
    return trace_format == "bailian"


def bailian_sessions(rows: Sequence[TraceRow]) -> list[str | None]:
    """Each row's session: the id of its conversation's first turn, the furthest turn its
    ``parent_chat_id`` links lead to (-1 or absent: none), whether or not the trace holds it."""
    parent = {
        row.chat_id: row.parent_chat_id
        for row in rows
        if row.chat_id is not None and row.parent_chat_id not in (None, -1)
    }
    roots: dict[int, int] = {}
    sessions: list[str | None] = []
    for row in rows:
        if row.chat_id is None:
            sessions.append(None)
            continue
        chain = [row.chat_id]
        while chain[-1] not in roots and chain[-1] in parent and len(chain) <= len(parent):
            chain.append(parent[chain[-1]])  # a cycle stops after len(parent) steps
        root = roots.get(chain[-1], chain[-1])
        roots.update(dict.fromkeys(chain, root))
        sessions.append(f"chat-{root}")
    return sessions


class BlockTokens:
    """Deterministic block of ``size`` token ids for each hash id (memoised, 4 bytes an id:
    as lists of ints the 44k hash ids of a 4,000-row trace held 0.8 GiB)."""

    def __init__(self, seed: int, vocab_size: int, size: int) -> None:
        self._seed = seed
        self._vocab_size = vocab_size
        self._size = size
        self._blocks: dict[int, array[int]] = {}

    def __call__(self, hash_id: int) -> array[int]:
        block = self._blocks.get(hash_id)
        if block is None:
            rng = random.Random(f"mooncake:{self._seed}:{hash_id}")
            block = array("I", random_tokens(rng, self._size, self._vocab_size))
            self._blocks[hash_id] = block
        return block


def prompt_tokens(
    row: TraceRow, index: int, blocks: BlockTokens, params: TraceParams
) -> array[int]:
    """The token-id prompt of one trace row with ``input_length``."""
    assert row.input_length is not None
    length = row.input_length
    if params.max_input_len is not None:
        length = min(length, params.max_input_len)
    tokens: array[int] = array("I")
    for hash_id in row.hash_ids:
        if len(tokens) >= length:
            break
        tokens.extend(blocks(hash_id))
    if len(tokens) < length:
        rng = random.Random(f"mooncake-pad:{params.seed}:{index}")
        tokens.extend(random_tokens(rng, length - len(tokens), params.vocab_size))
    del tokens[length:]
    return tokens


def build_trace_workload(
    rows: list[TraceRow],
    params: TraceParams,
    name: str = "mooncake",
    tokenizer: str | None = None,
) -> Workload:
    """The trace as a workload: open loop (each row at its timestamp) when every replayed row
    has one, else closed loop (each session's turns one after another). Rows that carry their
    prompt are tokenized with the ``tokenizer`` folder's tokenizer (default: the simulator's
    codec), loaded only when there are such rows."""
    if not rows:
        raise TraceError("the trace is empty")
    if params.skip_requests >= len(rows):
        raise TraceError(f"skip_requests={params.skip_requests} skips all {len(rows)} rows")
    bailian = is_bailian(rows, params.trace_format)
    block_tokens = params.block_tokens or infer_block_tokens(rows)
    tokenize = body_tokenizer(tokenizer) if any(row.has_text for row in rows) else None
    replay = _Replay(
        params=params,
        blocks=BlockTokens(params.seed, params.vocab_size, block_tokens),
        tokenize=tokenize,
        units_per_second=1.0 if bailian else 1000.0,
        sessions=(
            bailian_sessions(rows)
            if bailian
            else [None if row.session_id is None else str(row.session_id) for row in rows]
        ),
    )
    chosen = list(enumerate(rows))[params.skip_requests :]
    if any(row.timestamp is None for _, row in chosen):
        if params.max_requests is not None:
            chosen = chosen[: params.max_requests]
        sessions = replay.closed_loop(chosen)
        requests: tuple[BenchRequest, ...] = ()
        loop = f"{sum(len(s.turns) for s in sessions)} rows in {len(sessions)} closed-loop sessions"
    else:
        sessions, requests = (), replay.open_loop(chosen)
        loop = f"{len(requests)} rows"
    kind = "Bailian" if bailian else "Mooncake"
    texts = sum(row.has_text for _, row in chosen)
    prompts = f"{texts} rows with their own prompts" if texts else ""
    if texts < len(chosen):
        prompts += (", " if prompts else "") + f"{block_tokens}-token hash ids"
    return Workload(
        name=name,
        requests=requests,
        sessions=sessions,
        description=f"{kind} trace replay, {loop}, {prompts}, speed-up {params.speedup:g}",
        params=params.model_dump(),
    )


@dataclass(frozen=True)
class _Replay:
    params: TraceParams
    blocks: BlockTokens
    tokenize: BodyTokenizer | None
    units_per_second: float
    sessions: list[str | None]
    """Each row's session id (by its index in the trace)."""

    def request(self, index: int, row: TraceRow, arrival: float, think: float) -> BenchRequest:
        output = row.answer_tokens
        if self.params.max_output_len is not None:
            output = min(output, self.params.max_output_len)
        if row.has_text:
            request = self.text_request(index, row, output, arrival)
        else:
            tokens = prompt_tokens(row, index, self.blocks, self.params)
            request = completion_request(
                f"t{index}", tokens, output, arrival, session_id=self.sessions[index]
            )
        return replace(request, think_time_s=think) if think else request

    def text_request(self, index: int, row: TraceRow, output: int, arrival: float) -> BenchRequest:
        """A row that carries its prompt: its ``messages`` (and ``tools``) or ``text_input``,
        sent as is (``max_input_len`` does not cut it)."""
        assert self.tokenize is not None
        body: dict[str, Any]
        if row.messages is not None:
            path, body = CHAT_COMPLETIONS, {"messages": row.messages}
            if row.tools:
                body["tools"] = row.tools
        else:
            path, body = COMPLETIONS, {"prompt": row.text_input}
        try:
            units = self.tokenize(path, body)
        except ValueError as exc:  # what the pods would refuse
            raise TraceError(f"trace row {index + 1}: {exc}") from exc
        return BenchRequest(
            request_id=f"t{index}",
            path=path,
            body={**body, **exact_output_fields(output)},
            max_tokens=output,
            prefix_units=array("I", units),
            arrival_s=arrival,
            session_id=self.sessions[index],
        )

    def seconds(self, timestamp: float, start: float) -> float:
        return (timestamp - start) / self.units_per_second / self.params.speedup

    def open_loop(self, chosen: list[tuple[int, TraceRow]]) -> tuple[BenchRequest, ...]:
        params = self.params
        jitter = random.Random(f"mooncake-jitter:{params.seed}")
        start = min(row.timestamp or 0.0 for _, row in chosen)
        requests: list[BenchRequest] = []
        for index, row in chosen:
            if params.max_requests is not None and len(requests) >= params.max_requests:
                break
            arrival = self.seconds(row.timestamp or 0.0, start)
            if params.max_duration_s is not None and arrival > params.max_duration_s:
                continue
            if params.jitter_s > 0:
                arrival = max(0.0, arrival + jitter.uniform(-params.jitter_s, params.jitter_s))
            requests.append(self.request(index, row, arrival, 0.0))
        requests.sort(key=lambda request: request.arrival_s)
        return tuple(requests)

    def closed_loop(self, chosen: list[tuple[int, TraceRow]]) -> tuple[Session, ...]:
        """Rows grouped by session (a row without one is a session of its own), in trace order:
        a session starts at its first row's timestamp (the start, without one; the clock starts
        at the earliest) and each later turn leaves ``delay`` ms after the answer to the turn
        before (at once, without one)."""
        params = self.params
        jitter = random.Random(f"mooncake-jitter:{params.seed}")
        groups: dict[str, list[tuple[int, TraceRow]]] = {}
        for index, row in chosen:
            groups.setdefault(self.sessions[index] or f"t{index}", []).append((index, row))
        start = min(turns[0][1].timestamp or 0.0 for turns in groups.values())
        sessions: list[Session] = []
        for key, turns in groups.items():
            begin = self.seconds(turns[0][1].timestamp or 0.0, start)
            if params.max_duration_s is not None and begin > params.max_duration_s:
                continue
            if params.jitter_s > 0:
                begin = max(0.0, begin + jitter.uniform(-params.jitter_s, params.jitter_s))
            thinks = [(row.delay or 0.0) / 1000.0 / params.speedup for _, row in turns[1:]]
            thinks.append(0.0)
            requests = tuple(
                self.request(index, row, 0.0, think)
                for (index, row), think in zip(turns, thinks, strict=True)
            )
            sessions.append(Session(session_id=key, start_s=begin, turns=requests))
        sessions.sort(key=lambda session: session.start_s)
        return tuple(sessions)
