"""Long agent sessions three ways: full history, summarised at a threshold, AKV rolling drop.

Source: the SWE-agent trajectories (:func:`agent_sessions.load_histories`): system prompt, task,
then alternating assistant actions and tool observations (user messages that follow an
assistant message). Where a trajectory ends before ``turns`` assistant messages, it continues
synthetically: its own (action, observation) pairs again, in order, each prefixed with
``[step k]`` so that no two are equal (real lengths and text, new content). A session ends at
``turns`` turns or before its full history would exceed ``max_context_tokens``, so that the
three ways replay the same turns.

Every turn sends ``/v1/completions`` with token ids (one id per 4 characters, a CRC-32 of the
chunk, as the simulator's stand-in tokenizer does; each message cut on its own so that its ids
do not depend on its neighbours) and, per ``context``:

- ``full``: the whole history, resent every turn (the prefix cache serves all but the new turn);
- ``summarise``: when the prompt exceeds ``summarise_at_tokens``, every tool response but the
  last ``keep_tool_responses`` is replaced by a summary of ``summary_tokens`` tokens (its first
  characters), and older kept ones too until the prompt is at most half the threshold, as agents
  compact their context; the summaries stay (the next compaction adds to them).
  Each compaction rewrites the prompt from the first newly summarised message: the prefix cache
  misses from there;
- ``akv``: the whole history plus AKV cache ops in ``cache`` (``segments``: one per message;
  ``drop``: the tool-response rolling drop keeping the last ``keep_tool_responses``,
  ``kvgate.prefix.cache_ops.rolling_drop``), for pods with ``--sim-akv``: the prompt is never
  rewritten, the dropped KV is freed and no longer read.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvgate.bench.agent_sessions import (
    CHARS_PER_TOKEN,
    Message,
    load_histories,
    sessions_from_histories,
)
from kvgate.bench.workload import COMPLETIONS, BenchRequest, Workload, exact_output_fields
from kvgate.prefix.cache_ops import rolling_drop

ContextMode = Literal["full", "summarise", "akv"]
CONTEXT_MODES: tuple[ContextMode, ...] = ("full", "summarise", "akv")
_FIRST_ID = 1000
_ID_SPAN = 29000  # ids in [1000, 30000): valid for the simulator's default 32k vocabulary


class LongAgentParams(BaseModel):
    """Parameters of the long-agent-sessions workload."""

    model_config = ConfigDict(extra="forbid")

    context: ContextMode = Field(default="full", description="full | summarise | akv")
    num_sessions: int = Field(default=8, ge=1, description="concurrent agent sessions")
    turns: int = Field(default=300, ge=1, description="turns per session (before the cap)")
    max_context_tokens: int = Field(
        default=120_000, ge=1, description="a session ends before its full history passes this"
    )
    summarise_at_tokens: int = Field(
        default=32_000, ge=1, description="summarise: compact when the prompt passes this"
    )
    summary_tokens: int = Field(
        default=32, ge=1, description="summarise: tokens a summarised tool response keeps"
    )
    keep_tool_responses: int = Field(
        default=12, ge=0, description="tool responses kept whole (summarise) or in KV (akv)"
    )
    max_output_len: int = Field(default=256, ge=1, description="cap on the tokens asked per turn")
    think_time_s: float = Field(default=2.0, ge=0, description="mean pause between turns")
    ramp_s: float = Field(default=10.0, ge=0, description="session starts are spread over this")
    trajectory_dir: str | None = Field(
        default=None, description="folder of *.traj files; default: bundled copy"
    )
    seed: int = Field(default=0, description="seed of every random choice")


def message_units(message: Message) -> list[int]:
    """Stand-in token ids of one message rendered as the simulator's fallback template does."""
    text = f"<|{message['role']}|>\n{message['content']}\n"
    return [
        _FIRST_ID + zlib.crc32(text[i : i + CHARS_PER_TOKEN].encode()) % _ID_SPAN
        for i in range(0, len(text), CHARS_PER_TOKEN)
    ]


GENERATION_PROMPT = message_units({"role": "assistant", "content": ""})[:3]


def long_history(history: list[Message], turns: int) -> list[Message]:
    """``history`` continued with its own (action, observation) pairs until it holds
    ``turns`` assistant messages."""
    first = next((i for i, m in enumerate(history) if m["role"] == "assistant"), len(history))
    pairs = [
        (history[i], history[i + 1])
        for i in range(first, len(history) - 1)
        if history[i]["role"] == "assistant" and history[i + 1]["role"] == "user"
    ]
    out = [dict(m) for m in history]
    count = sum(1 for m in out if m["role"] == "assistant")
    step = 0
    while pairs and count < turns:
        action, observation = pairs[step % len(pairs)]
        step += 1
        out.append({"role": "assistant", "content": f"[step {step}] {action['content']}"})
        out.append({"role": "user", "content": f"[step {step}] {observation['content']}"})
        count += 1
    return out


def tool_responses(messages: Sequence[Message]) -> list[int]:
    """Indices of the observations: user messages that follow an assistant message."""
    return [
        i
        for i in range(1, len(messages))
        if messages[i]["role"] == "user" and messages[i - 1]["role"] == "assistant"
    ]


class _Compactor:
    """The summarise mode's state: which tool responses are summarised so far.

    Past the threshold, every tool response but the last ``keep_tool_responses`` is summarised,
    then older kept ones too until the prompt is at most half the threshold (agents compact to
    well under their limit, or they would compact, and miss the cache, on every turn)."""

    def __init__(self, params: LongAgentParams) -> None:
        self.params = params
        self.summarised: set[int] = set()

    def prompt(self, messages: list[Message], units: list[list[int]]) -> list[list[int]]:
        current = self._render(messages, units)
        threshold = self.params.summarise_at_tokens
        if sum(map(len, current)) <= threshold:
            return current
        tools = [i for i in tool_responses(messages) if i not in self.summarised]
        keep = self.params.keep_tool_responses
        for k, index in enumerate(tools):
            size = sum(map(len, current))
            if k >= len(tools) - keep and size <= threshold // 2:
                break
            self.summarised.add(index)
            current[index] = self._summary(index, messages[index])
        return current

    def _render(self, messages: list[Message], units: list[list[int]]) -> list[list[int]]:
        return [
            self._summary(i, m) if i in self.summarised else units[i]
            for i, m in enumerate(messages)
        ]

    def _summary(self, index: int, message: Message) -> list[int]:
        text = (
            f"[summary of output {index}] "
            + message["content"][: self.params.summary_tokens * CHARS_PER_TOKEN]
        )
        return message_units({"role": message["role"], "content": text})


def session_turns(
    session_id: str, history: list[Message], params: LongAgentParams, rng: random.Random
) -> tuple[BenchRequest, ...]:
    units = [message_units(m) for m in history]
    compactor = _Compactor(params)
    turns: list[BenchRequest] = []
    full_tokens = 0
    for position, message in enumerate(history):
        if position:
            full_tokens += len(units[position - 1])
        if message["role"] != "assistant" or position == 0:
            continue
        if (
            len(turns) >= params.turns
            or full_tokens + len(GENERATION_PROMPT) > params.max_context_tokens
        ):
            break
        prompt = history[:position]
        segments = (
            compactor.prompt(prompt, units) if params.context == "summarise" else units[:position]
        )
        ids = [t for segment in segments for t in segment] + GENERATION_PROMPT
        output = max(1, min(params.max_output_len, len(message["content"]) // CHARS_PER_TOKEN))
        body: dict[str, Any] = {"prompt": ids, **exact_output_fields(output), "user": session_id}
        if params.context == "akv":
            ops = rolling_drop(tool_responses(prompt), params.keep_tool_responses)
            if ops is not None:
                body["cache"] = {"segments": [len(s) for s in segments], **ops.to_json()}
        think = rng.expovariate(1.0 / params.think_time_s) if params.think_time_s > 0 else 0.0
        turns.append(
            BenchRequest(
                request_id=f"{session_id}-t{len(turns)}",
                path=COMPLETIONS,
                body=body,
                max_tokens=output,
                prefix_units=tuple(ids),
                session_id=session_id,
                think_time_s=think,
            )
        )
    return tuple(turns)


def build_long_agent_sessions(
    params: LongAgentParams, name: str = "long-agent-sessions"
) -> Workload:
    rng = random.Random(params.seed)
    histories = [h for h in load_histories(params.trajectory_dir) if len(h) >= 4]
    sessions = sessions_from_histories(
        histories,
        params.num_sessions,
        params.ramp_s,
        rng,
        prepare=lambda history: long_history(history, params.turns),
        turns_of=lambda session_id, history: session_turns(session_id, history, params, rng),
    )
    return Workload(
        name=name,
        sessions=tuple(sessions),
        description=(
            f"{len(sessions)} long SWE-agent sessions (up to {params.turns} turns, "
            f"{params.max_context_tokens} tokens), context: {params.context}"
        ),
        params=params.model_dump(),
    )
