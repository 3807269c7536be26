"""Multi-turn agent sessions replayed from real SWE-agent trajectories.

Source: the ``history`` list of each ``*.traj`` file (system prompt, task, then alternating
assistant actions and tool observations). A trajectory becomes one closed-loop session: for every
assistant message at position *k*, one turn sends ``history[:k]`` (the whole conversation so far,
resent every turn, as an agent does) to ``/v1/chat/completions`` and asks for as many tokens as the
recorded assistant message had (about 4 characters a token, capped by ``max_output_len``). After
each answer the session pauses for an exponential think/tool time of mean ``think_time_s``.

Scaling to many concurrent sessions: session *i* replays trajectory ``i mod T`` (order shuffled by
``seed``) with ``[session i]`` prepended to its first user message, so sessions of one trajectory
share the system prompt but not the task; session starts form a Poisson process that spreads
``num_sessions`` starts over ``ramp_s`` seconds. ``max_turns`` cuts every session short.

With ``api=responses`` each turn goes to ``/v1/responses`` (:func:`responses_body`): the
system prompt as ``instructions``, the rest as input items, resent whole as the Agents SDK does
without ``previous_response_id``; with ``api=messages`` to ``/v1/messages`` (Anthropic's
Messages API, :func:`messages_body`), the system prompt as ``system``.

With ``api=completions`` the history is rendered to text (:func:`render_chat_text`, the
simulator's fallback template) and sent to ``/v1/completions``: the pod computes the same tokens,
and a client or router that measures TTFT at the first byte is not misled by a server that opens
chat streams with a role-only chunk before the first token.

Roles other than system/user/assistant (``tool``) are sent as ``user`` messages: the chat template
renders the observation text either way, and plain roles pass every OpenAI validator.

The bundled copy (``data/swe_agent_histories.jsonl.gz``, MIT, see ``data/LICENSE.SWE-agent``) holds
only the role and content of each history, so the demo runs from a fresh install.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvgate.bench.workload import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    MESSAGES,
    PREVIOUS_RESPONSE,
    RESPONSES,
    BenchRequest,
    Session,
    Workload,
    exact_output_fields,
)

Message = dict[str, str]
# Renders messages with the pods' chat template and tokenizes them; None = character stand-ins.
ChatTokenizer = Callable[[Sequence[Message]], list[int]]

BUNDLED_HISTORIES = "swe_agent_histories.jsonl.gz"
CHARS_PER_TOKEN = 4


class AgentSessionParams(BaseModel):
    """Parameters of the agent-session workload."""

    model_config = ConfigDict(extra="forbid")

    num_sessions: int = Field(default=32, ge=1, description="concurrent agent sessions to replay")
    ramp_s: float = Field(default=10.0, ge=0, description="session starts are spread over this")
    max_turns: int | None = Field(
        default=None, ge=1, description="cut each session after this many turns"
    )
    think_time_s: float = Field(
        2.0, ge=0, description="mean pause between a turn's answer and the next turn"
    )
    max_output_len: int = Field(default=256, ge=1, description="cap on the tokens asked per turn")
    api: Literal["chat", "completions", "responses", "messages"] = Field(
        default="chat",
        description="chat: send messages; completions: send the history rendered as text "
        "with the simulator's fallback chat template (see render_chat_text); responses: send "
        "the system prompt as `instructions` and the rest as `input` items to /v1/responses, "
        "the whole history every turn, nothing stored; messages: Anthropic's Messages API "
        "(/v1/messages), the system prompt as `system`",
    )
    chain_responses: bool = Field(
        default=False,
        description="with api=responses: each turn after the first names the answer before it "
        "(`previous_response_id`) and sends only its new messages, the pod's stored response "
        "holding the rest (live only: vLLM stores responses in the pod's memory)",
    )
    trajectory_dir: str | None = Field(
        None, description="folder of *.traj files; default: bundled copy"
    )
    seed: int = Field(default=0, description="seed of every random choice")


def _message(raw: dict[str, Any]) -> Message:
    role = str(raw.get("role", "user"))
    content = raw.get("content", "")
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    return {"role": role if role in ("system", "user", "assistant") else "user", "content": content}


def load_trajectory(path: Path) -> list[Message]:
    """The message history of one SWE-agent ``.traj`` file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [_message(raw) for raw in data.get("history", [])]


def load_histories(trajectory_dir: str | None) -> list[list[Message]]:
    """Histories from ``*.traj`` files in a folder, or from the bundled copy."""
    if trajectory_dir is not None:
        paths = sorted(Path(trajectory_dir).glob("*.traj"))
        if not paths:
            raise FileNotFoundError(f"no *.traj files in {trajectory_dir}")
        return [load_trajectory(path) for path in paths]
    bundled = resources.files("kvgate.bench").joinpath("data", BUNDLED_HISTORIES)
    with bundled.open("rb") as raw_file, gzip.open(raw_file, "rt", encoding="utf-8") as handle:
        return [[_message(raw) for raw in json.loads(line)] for line in handle if line.strip()]


def render_chat_text(messages: Sequence[Message]) -> str:
    """The text the simulator's fallback codec renders for ``messages`` (generation prompt
    included): sending it to ``/v1/completions`` gives the pod the same tokens as the chat
    request would."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


_UNIT_MODULUS = 2**31 - 1  # a prime: stand-in ids stay valid 31-bit token ids


def character_units(messages: Sequence[Message]) -> list[int]:
    """Stand-in token ids: the ChatML-like text cut into 4-character chunks, each chunk's code
    points read as one number modulo a 31-bit prime (equal chunks, equal ids; different chunks
    collide with probability ~2⁻³¹), so they fit where real token ids go (the KV-event wire)."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    out: list[int] = []
    for i in range(0, len(text), CHARS_PER_TOKEN):
        chunk = text[i : i + CHARS_PER_TOKEN]
        value = 0
        for char in chunk:
            value = value * 0x110000 + ord(char)
        out.append(value % _UNIT_MODULUS)
    return out


_PATHS = {
    "chat": CHAT_COMPLETIONS,
    "completions": COMPLETIONS,
    "responses": RESPONSES,
    "messages": MESSAGES,
}


def responses_body(prompt: Sequence[Message], output: int, session_id: str) -> dict[str, Any]:
    """A Responses API turn: a leading system message as `instructions`, the rest as message
    items, exactly `output` tokens asked (vLLM's Responses API takes `ignore_eos`), not stored
    (the agent resends its history)."""
    system = prompt[0]["content"] if prompt and prompt[0]["role"] == "system" else None
    items = [dict(m) for m in prompt[1 if system is not None else 0 :]]
    body: dict[str, Any] = {
        "input": items,
        "max_output_tokens": output,
        "ignore_eos": True,
        "temperature": 0.0,
        "store": False,
        "user": session_id,
    }
    if system is not None:
        body["instructions"] = system
    return body


def messages_body(prompt: Sequence[Message], output: int) -> dict[str, Any]:
    """An Anthropic Messages API turn: a leading system message as `system`, the rest as
    messages (plain text content), `output` tokens at most."""
    system = prompt[0]["content"] if prompt and prompt[0]["role"] == "system" else None
    messages = [dict(m) for m in prompt[1 if system is not None else 0 :]]
    body: dict[str, Any] = {"messages": messages, "max_tokens": output, "temperature": 0.0}
    if system is not None:
        body["system"] = system
    return body


def session_turns(
    session_id: str,
    history: list[Message],
    params: AgentSessionParams,
    rng: random.Random,
    tokenize: ChatTokenizer | None,
) -> tuple[BenchRequest, ...]:
    turns: list[BenchRequest] = []
    previous_position = 0  # the assistant message the turn before answered
    for position, message in enumerate(history):
        if message["role"] != "assistant" or position == 0:
            continue
        if params.max_turns is not None and len(turns) >= params.max_turns:
            break
        prompt = history[:position]
        output = max(1, min(params.max_output_len, len(message["content"]) // CHARS_PER_TOKEN))
        units = tokenize(prompt) if tokenize is not None else character_units(prompt)
        think = rng.expovariate(1.0 / params.think_time_s) if params.think_time_s > 0 else 0.0
        body: dict[str, Any] = {**exact_output_fields(output), "user": session_id}
        if params.api == "chat":
            body["messages"] = [dict(m) for m in prompt]
        elif params.api == "responses":
            body = responses_body(prompt, output, session_id)
            since = history[previous_position + 1 : position]
            if params.chain_responses and turns and since:  # only what came since the answer
                body = {**body, "input": [dict(m) for m in since], "store": True,
                        "previous_response_id": PREVIOUS_RESPONSE}  # fmt: skip
            elif params.chain_responses:
                body["store"] = True
        elif params.api == "messages":
            body = messages_body(prompt, output)
        else:
            body["prompt"] = render_chat_text(prompt)
        previous_position = position
        turns.append(
            BenchRequest(
                request_id=f"{session_id}-t{len(turns)}",
                path=_PATHS[params.api],
                body=body,
                max_tokens=output,
                prefix_units=tuple(units),
                session_id=session_id,
                think_time_s=think,
            )
        )
    return tuple(turns)


def sessions_from_histories(
    histories: Sequence[list[Message]],
    num_sessions: int,
    ramp_s: float,
    rng: random.Random,
    *,
    prepare: Callable[[list[Message]], list[Message]],
    turns_of: Callable[[str, list[Message]], tuple[BenchRequest, ...]],
) -> list[Session]:
    """`num_sessions` sessions `s0, s1, ...` over the histories in a shuffled order (repeated
    as needed). Each gets a copy (`prepare`) whose first user message names its session, so no
    two sessions share more than the system prompt, then its turns (`turns_of`); sessions start
    as a Poisson process over `ramp_s` (all at 0 when it is 0)."""
    order = list(range(len(histories)))
    rng.shuffle(order)
    rate = num_sessions / ramp_s if ramp_s > 0 else 0.0
    sessions: list[Session] = []
    start = 0.0
    for index in range(num_sessions):
        history = prepare(histories[order[index % len(order)]])
        first_user = next(i for i, m in enumerate(history) if m["role"] == "user")
        labelled = f"[session {index}] " + str(history[first_user]["content"])
        history[first_user] = {**history[first_user], "content": labelled}
        session_id = f"s{index}"
        turns = turns_of(session_id, history)
        if turns:
            sessions.append(Session(session_id=session_id, start_s=start, turns=turns))
        if rate > 0:
            start += rng.expovariate(rate)
    return sessions


def build_agent_sessions(
    params: AgentSessionParams,
    tokenize: ChatTokenizer | None = None,
    name: str = "agent-sessions",
) -> Workload:
    rng = random.Random(params.seed)
    histories = [h for h in load_histories(params.trajectory_dir) if len(h) >= 3]
    sessions = sessions_from_histories(
        histories,
        params.num_sessions,
        params.ramp_s,
        rng,
        prepare=lambda history: [dict(m) for m in history],
        turns_of=lambda session_id, history: session_turns(
            session_id, history, params, rng, tokenize
        ),
    )
    return Workload(
        name=name,
        sessions=tuple(sessions),
        description=(
            f"{len(sessions)} SWE-agent sessions from {len(histories)} trajectories, "
            + (
                "each turn continuing the stored answer before it"
                if params.chain_responses and params.api == "responses"
                else "history resent every turn"
            )
            + f", think time ~{params.think_time_s:g}s"
        ),
        params=params.model_dump(),
    )
