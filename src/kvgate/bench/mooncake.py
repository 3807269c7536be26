"""Mooncake-format trace replay.

A trace is JSONL, one request per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2, 3]}

``timestamp`` is in milliseconds from the start of the trace; each entry of ``hash_ids`` stands for
one block of :data:`MOONCAKE_BLOCK_TOKENS` prompt tokens, and the ids are chained on their prefix:
two requests whose ``hash_ids`` start with the same *k* ids share their first ``k * 512`` tokens.

Replay: each hash id maps to a deterministic block of 512 token ids drawn from a PRNG seeded by
(trace seed, hash id), so the same id is the same tokens in every request and every run. The
prompt is the concatenation of its blocks cut to ``input_length`` (padded with request-unique
tokens if the ids cover fewer tokens). Arrival = ``timestamp / 1000 / speedup`` plus uniform
jitter in ``[-jitter_s, +jitter_s]`` (clamped at 0). ``skip_requests`` starts the replay further
into the file (its clock starts at the first row replayed), so that a policy tuned on one window
of a trace can be checked on others; ``max_requests`` and ``max_duration_s`` cut the replay
short; ``max_input_len`` caps prompt length (keeping the leading blocks).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvgate.bench.workload import BenchRequest, Workload, completion_request, random_tokens

MOONCAKE_BLOCK_TOKENS = 512


class TraceRow(BaseModel):
    """One line of a Mooncake trace."""

    model_config = ConfigDict(extra="ignore")

    timestamp: float = Field(ge=0, description="milliseconds since the trace start")
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=1)
    hash_ids: list[int] = Field(default_factory=list)


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
    vocab_size: int = Field(default=32000, ge=2000, description="token ids are drawn below this")
    seed: int = Field(default=0, description="seeds the hash-id blocks and the jitter")


class TraceError(ValueError):
    """A trace line that is not valid Mooncake JSON."""


def read_trace(lines: Iterable[str], source: str = "trace") -> list[TraceRow]:
    """Parse JSONL lines (blank lines skipped); errors name the line."""
    rows: list[TraceRow] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(TraceRow.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise TraceError(f"{source}:{number}: not a Mooncake trace row: {exc}") from exc
    return rows


def read_trace_file(path: Path) -> list[TraceRow]:
    with path.open(encoding="utf-8") as handle:
        return read_trace(handle, source=str(path))


class BlockTokens:
    """Deterministic 512-token block for each hash id (memoised)."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        self._seed = seed
        self._vocab_size = vocab_size
        self._blocks: dict[int, list[int]] = {}

    def __call__(self, hash_id: int) -> list[int]:
        block = self._blocks.get(hash_id)
        if block is None:
            rng = random.Random(f"mooncake:{self._seed}:{hash_id}")
            block = random_tokens(rng, MOONCAKE_BLOCK_TOKENS, self._vocab_size)
            self._blocks[hash_id] = block
        return block


def prompt_tokens(row: TraceRow, index: int, blocks: BlockTokens, params: TraceParams) -> list[int]:
    """The token-id prompt of one trace row."""
    length = row.input_length
    if params.max_input_len is not None:
        length = min(length, params.max_input_len)
    tokens: list[int] = []
    for hash_id in row.hash_ids:
        if len(tokens) >= length:
            break
        tokens.extend(blocks(hash_id))
    if len(tokens) < length:
        rng = random.Random(f"mooncake-pad:{params.seed}:{index}")
        tokens.extend(random_tokens(rng, length - len(tokens), params.vocab_size))
    return tokens[:length]


def build_trace_workload(
    rows: list[TraceRow], params: TraceParams, name: str = "mooncake"
) -> Workload:
    if not rows:
        raise TraceError("the trace is empty")
    if params.skip_requests >= len(rows):
        raise TraceError(f"skip_requests={params.skip_requests} skips all {len(rows)} rows")
    blocks = BlockTokens(params.seed, params.vocab_size)
    jitter = random.Random(f"mooncake-jitter:{params.seed}")
    replayed = rows[params.skip_requests :]
    start_ms = min(row.timestamp for row in replayed)
    requests: list[BenchRequest] = []
    for index, row in enumerate(replayed, start=params.skip_requests):
        if params.max_requests is not None and len(requests) >= params.max_requests:
            break
        arrival = (row.timestamp - start_ms) / 1000.0 / params.speedup
        if params.max_duration_s is not None and arrival > params.max_duration_s:
            continue
        if params.jitter_s > 0:
            arrival = max(0.0, arrival + jitter.uniform(-params.jitter_s, params.jitter_s))
        output = row.output_length
        if params.max_output_len is not None:
            output = min(output, params.max_output_len)
        tokens = prompt_tokens(row, index, blocks, params)
        requests.append(completion_request(f"t{index}", tokens, output, arrival))
    requests.sort(key=lambda request: request.arrival_s)
    return Workload(
        name=name,
        requests=tuple(requests),
        description=f"Mooncake trace replay, {len(requests)} rows, speed-up {params.speedup:g}",
        params=params.model_dump(),
    )
