"""Per-session prefix-break detection: where did this turn stop extending the previous one?

An agent session resends its whole history every turn; every block of the previous turn's prompt
should reappear, unchanged, at the start of this turn's prompt. When it does not (a timestamp in
the system prompt, reordered tools, a template that rewrites earlier turns), the cache is lost
from that point on. For each session the tracker keeps the previous turn's block keys (8 bytes
each) and a digest of every request field; on the next turn it finds the first differing block
(the token position of the break) and, with `kvgate.prefix.first_difference` over the digests,
the first differing message and field (the same answer `kvgate prefix diff` gives), counts the
break in `kvgate_router_prefix_breaks_total{field}` and logs it. A break with no differing field
is the chat template's doing ("template": e.g. one that rewrites earlier turns).

Memory is bounded: at most `max_sessions` sessions (least recently seen dropped first), each
forgotten `ttl` seconds after its last turn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.prefix import common_prefix_length, first_difference
from kvgate.router.core.routing import RoutePlan
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefixBreak:
    session: str
    token_position: int  # first token (block-aligned) that differs from the previous turn
    previous_tokens: int
    path: str  # the first differing field, e.g. "messages[0].content", "tools"
    field: str  # its kind, a bounded metric label: "content", "tools", "role", ... or "template"


@dataclass
class _Turn:
    keys: list[bytes]  # 8-byte prefixes of the block keys
    block_tokens: int
    digest: dict[str, Any]  # the body with every field value replaced by a short digest
    seen_at: float


def _digest(value: Any) -> str:
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    # surrogatepass: a digest must never fail on text the parser let through.
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def digest_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """What prefix-break location needs of a body, in a few bytes per field."""
    out: dict[str, Any] = {}
    messages = body.get("messages")
    if isinstance(messages, list):
        out["messages"] = [
            {k: _digest(v) for k, v in m.items()} if isinstance(m, dict) else _digest(m)
            for m in messages
        ]
        for name in ("tools", "chat_template", "documents", "chat_template_kwargs"):
            if name in body:
                out[name] = _digest(body[name])
    elif "prompt" in body:
        out["prompt"] = _digest(body["prompt"])
    return out


def _field_label(path: str) -> str:
    """`messages[3].content` -> `content`; `tools` -> `tools` (bounded label values)."""
    last = path.rsplit(".", 1)[-1]
    return last.split("[", 1)[0] or "messages"


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

    def configure(self, max_sessions: int, ttl_seconds: float) -> None:
        """New limits (config reload); excess sessions are dropped, oldest first."""
        self._max, self._ttl = max_sessions, ttl_seconds
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)

    def observe(self, plan: RoutePlan, body: Mapping[str, Any]) -> PrefixBreak | None:
        session = plan.classification.session_id
        if session is None or self._max == 0:
            return None
        now = self._clock()
        turn = _Turn(
            keys=[k[:8] for k in plan.keys.block_keys],
            block_tokens=plan.keys.block_tokens,
            digest=digest_body(body),
            seen_at=now,
        )
        prev = self._turns.pop(session, None)
        self._turns[session] = turn
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)
        if prev is None or now - prev.seen_at > self._ttl:
            return None
        common = common_prefix_length(prev.keys, turn.keys)
        if common >= len(prev.keys):
            return None
        _kind, difference = first_difference(prev.digest, turn.digest)
        path = difference.path if difference is not None else "template"
        brk = PrefixBreak(
            session=session,
            token_position=common * prev.block_tokens,
            previous_tokens=len(prev.keys) * prev.block_tokens,
            path=path,
            field=_field_label(path) if difference is not None else "template",
        )
        self._metrics.prefix_breaks.labels(plan.pool.key, brk.field).inc()
        lost = brk.previous_tokens - brk.token_position
        self._metrics.prefix_break_lost_tokens.labels(plan.pool.key).observe(lost)
        log.info(
            "prefix break: session=%s at token %d of %d, first difference in %s",
            brk.session,
            brk.token_position,
            brk.previous_tokens,
            brk.path,
        )
        return brk
