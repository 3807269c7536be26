"""Per-session prefix-break detection: where did this turn stop extending the previous one?

An agent session resends its whole history every turn; every block of the previous turn's prompt
should reappear, unchanged, at the start of this turn's prompt. When it does not (a timestamp in
the system prompt, reordered tools, a template that rewrites earlier turns), the cache is lost
from that point on. For each session the tracker keeps the previous turn's block keys (8 bytes
each) and a digest per message field; on the next turn it finds the first differing block (the
token position of the break) and the first differing message and field, counts the break in
`kvgate_router_prefix_breaks_total{field}` and logs it.

Memory is bounded: at most `max_sessions` sessions (least recently seen dropped first), each
forgotten `ttl` seconds after its last turn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.router.metrics import RouterMetrics
from kvgate.router.routing import RoutePlan

log = logging.getLogger(__name__)

_FIELDS = ("role", "name", "content", "tool_calls", "tool_call_id")


@dataclass(frozen=True)
class PrefixBreak:
    session: str
    token_position: int  # first token (block-aligned) that differs from the previous turn
    previous_tokens: int
    message_index: int | None  # first differing message, None if only tools/other fields moved
    field: str  # "tools", "role", "content", ... or "template" when every message matched


@dataclass
class _Turn:
    keys: list[bytes]  # 8-byte prefixes of the block keys
    block_tokens: int
    tools: bytes
    messages: list[dict[str, bytes]]
    seen_at: float


def _digest(value: Any) -> bytes:
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.blake2b(raw.encode(), digest_size=8).digest()


def _fingerprint(body: Mapping[str, Any]) -> tuple[bytes, list[dict[str, bytes]]]:
    messages = body.get("messages")
    out: list[dict[str, bytes]] = []
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                out.append({f: _digest(message[f]) for f in _FIELDS if f in message})
    return _digest(body.get("tools")), out


def first_difference(prev: Sequence[bytes], cur: Sequence[bytes]) -> int:
    n = min(len(prev), len(cur))
    for i in range(n):
        if prev[i] != cur[i]:
            return i
    return n


class SessionTracker:
    def __init__(
        self,
        metrics: RouterMetrics,
        max_sessions: int = 10_000,
        ttl_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._clock = clock
        self._turns: OrderedDict[str, _Turn] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def observe(self, plan: RoutePlan, body: Mapping[str, Any]) -> PrefixBreak | None:
        session = plan.classification.session_id
        if session is None or self._max == 0:
            return None
        now = self._clock()
        tools, messages = _fingerprint(body)
        turn = _Turn(
            keys=[k[:8] for k in plan.keys.block_keys],
            block_tokens=plan.keys.block_tokens,
            tools=tools,
            messages=messages,
            seen_at=now,
        )
        prev = self._turns.pop(session, None)
        self._turns[session] = turn
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)
        if prev is None or now - prev.seen_at > self._ttl:
            return None
        common = first_difference(prev.keys, turn.keys)
        if common >= len(prev.keys):
            return None
        found = self._locate(prev, turn)
        brk = PrefixBreak(
            session=session,
            token_position=common * prev.block_tokens,
            previous_tokens=len(prev.keys) * prev.block_tokens,
            message_index=found[0],
            field=found[1],
        )
        self._metrics.prefix_breaks.labels(plan.pool.key, brk.field).inc()
        log.info(
            "prefix break: session=%s token=%d of %d message=%s field=%s",
            brk.session,
            brk.token_position,
            brk.previous_tokens,
            brk.message_index,
            brk.field,
        )
        return brk

    @staticmethod
    def _locate(prev: _Turn, cur: _Turn) -> tuple[int | None, str]:
        if prev.tools != cur.tools:
            return None, "tools"
        for i, (a, b) in enumerate(zip(prev.messages, cur.messages, strict=False)):
            if a != b:
                for f in _FIELDS:
                    if a.get(f) != b.get(f):
                        return i, f
        if len(cur.messages) < len(prev.messages):
            return len(cur.messages), "messages-removed"
        return None, "template"
