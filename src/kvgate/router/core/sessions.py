"""Per-session prefix-break detection: where did this turn stop extending the previous one?

An agent session resends its whole history every turn; every block of the previous turn's prompt
should reappear, unchanged, at the start of this turn's prompt. When it does not (a timestamp in
the system prompt, reordered tools, a template that rewrites earlier turns), the cache is lost
from that point on. For each session the tracker keeps the previous turn's block keys (8 bytes
each) and a digest of every request field; on the next turn it finds the first differing block
(the token position of the break) and, with `kvgate.prefix.first_difference` over the digests,
the first differing message and field (the same answer `kvgate prefix diff` gives), counts the
break in `kvgate_router_prefix_breaks_total{field}` and logs it. A break with no differing field
is the chat template's doing ("template": e.g. one that rewrites earlier turns). A message key
the client made up is counted as "other" and its path cut to `MAX_PATH_CHARS` in the log: the
client chooses it, so as a label or a whole log line it would be unbounded.

Memory is bounded: at most `max_sessions` sessions and `max_bytes` in all (least recently seen
dropped first; a turn is counted as its session id, 8 bytes per block and ~120 bytes per
digested field; a turn over an eighth of the budget is not kept), each forgotten `ttl` seconds
after its last turn. Session ids are short: the classifier replaces long ones by a digest.

Time is bounded too: a body's digest walks at most `MAX_DIGEST_NODES` values a top-level field
(text is hashed as it is), and one of `DIGEST_IN_THREAD_BYTES` or more is digested in a worker thread, the event
loop serving other requests meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.prefix import FIELD_NAMES, first_difference
from kvgate.prefix.approx import system_text
from kvgate.router.core.routing import RoutePlan
from kvgate.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

DIGEST_IN_THREAD_BYTES = 1 << 15


@dataclass(frozen=True)
class PrefixBreak:
    session: str
    token_position: int  # first token (block-aligned) that differs from the previous turn
    previous_tokens: int
    path: str  # the first differing field, e.g. "messages[0].content", "tools" (cut short)
    field: str  # its kind, a bounded metric label: "content", "tools", ..., "template", "other"


KEY_PREFIX_BYTES = 8
MAX_PATH_CHARS = 200  # of a break's path, kept and logged: a message key may be megabytes long
_DIGEST_FIELD_BYTES = 120  # a dict slot, a short key and a 16-character hex digest
_DIGEST_CONTAINER_BYTES = 120  # an empty dict or list (tracemalloc: a message's dict ~180)
_TURN_OVERHEAD = 400


@dataclass
class _Turn:
    keys: bytes  # the 8-byte prefixes of the block keys, concatenated
    block_tokens: int
    digest: dict[str, Any]  # the body with every field value replaced by a short digest
    seen_at: float
    bytes: int = 0  # what keeping it costs, as counted against the budget

    @property
    def blocks(self) -> int:
        return len(self.keys) // KEY_PREFIX_BYTES


def _digest_bytes(digest: Any) -> int:
    """What a `digest_body` result holds in memory: its digested values and the dicts and
    lists around them (iteratively: no recursion)."""
    total = 0
    stack = [digest]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
            total += _DIGEST_CONTAINER_BYTES
        elif isinstance(value, list):
            stack.extend(value)
            total += _DIGEST_CONTAINER_BYTES
        else:
            total += _DIGEST_FIELD_BYTES
    return total


def _common_blocks(a: bytes, b: bytes) -> int:
    """Leading 8-byte blocks that `a` and `b` share (bisection on slices, in C)."""
    n = min(len(a), len(b)) // KEY_PREFIX_BYTES * KEY_PREFIX_BYTES
    if a[:n] == b[:n]:
        return n // KEY_PREFIX_BYTES
    lo, hi = 0, n // KEY_PREFIX_BYTES  # blocks: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        s, e = lo * KEY_PREFIX_BYTES, mid * KEY_PREFIX_BYTES
        if a[s:e] == b[s:e]:
            lo = mid
        else:
            hi = mid
    return lo


MAX_DIGEST_NODES = 1 << 16
"""Values (messages, fields, list items, dict entries) the digest of one top-level field of a
body walks: past it a list or an object is digested by its length only. A body of 1M tiny objects in one made-up field
took 0.5 s to digest, in one call that held the GIL (threads do not help)."""


class _Digester:
    """Digests of one top-level field, walking at most `MAX_DIGEST_NODES` values in all. Text is
    hashed as it is (in C, which lets other threads run for long text); structure is walked in
    Python a value at a time, keys sorted, Anthropic's `cache_control` markers left out."""

    def __init__(self) -> None:
        self.nodes = MAX_DIGEST_NODES

    def field(self, value: Any) -> str:
        digest = hashlib.blake2b(digest_size=8)
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                # surrogatepass: a digest must never fail on text the parser let through.
                digest.update(b"s%d:" % len(item))
                digest.update(item.encode("utf-8", "surrogatepass"))
            elif isinstance(item, dict):
                size = len(item) - ("cache_control" in item)
                digest.update(b"d%d:" % size)
                if self._walks(size):  # before sorting: a huge object is not sorted
                    for key in sorted((k for k in item if k != "cache_control"), reverse=True):
                        stack.extend((item[key], key))
            elif isinstance(item, list):
                digest.update(b"l%d:" % len(item))
                if self._walks(len(item)):
                    stack.extend(reversed(item))
            else:
                text = repr(item).encode()
                digest.update(b"v%d:" % len(text))
                digest.update(text)
        return digest.hexdigest()

    def items(self, items: list[Any]) -> list[Any]:
        """A list of messages or input items, each object by its fields."""
        out: list[Any] = []
        for item in items:
            if not self._walks(1):
                out.append(f"+{len(items) - len(out)}")  # the rest, by its length
                break
            if isinstance(item, dict):
                out.append({k: self.field(v) for k, v in item.items()})
            else:
                out.append(self.field(item))
        return out

    def _walks(self, values: int) -> bool:
        if values > self.nodes:
            self.nodes = 0
            return False
        self.nodes -= values
        return True


def digest_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """What prefix-break location needs of a body, in a few bytes per field. Each top-level
    field has its own budget of values: a field digested by its length on one turn, because
    another used the budget up, would pass for the field that changed."""
    out: dict[str, Any] = {}
    messages = body.get("messages")
    if isinstance(messages, list):
        out["messages"] = _Digester().items(messages)
        for name in ("tools", "chat_template", "documents", "chat_template_kwargs"):
            if name in body:
                out[name] = _Digester().field(body[name])
        if "system" in body:  # Anthropic's, as the keys read it (no Claude Code billing header)
            out["system"] = _Digester().field(system_text(body))
    elif "input" in body and not isinstance(body.get("prompt"), (str, list)):  # Responses
        items = body["input"]
        digester = _Digester()
        out["input"] = digester.items(items) if isinstance(items, list) else digester.field(items)
        for name in ("tools", "instructions"):
            if name in body:
                out[name] = _Digester().field(body[name])
    elif "prompt" in body:
        out["prompt"] = _Digester().field(body["prompt"])
    return out


def _field_label(path: str) -> str:
    """`messages[3].content` -> `content`; `tools` -> `tools`; a message key of the client's
    own -> `other` (label values from a fixed set)."""
    _message, _, key = path.partition("].")  # a key may itself hold "." or "["
    name = key or path.split("[", 1)[0]
    return name if name in FIELD_NAMES else "other"


class SessionTracker:
    def __init__(
        self,
        metrics: RouterMetrics,
        max_sessions: int = 10_000,
        ttl_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_bytes: int = 32 << 20,
    ) -> None:
        self._metrics = metrics
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._max_bytes = max_bytes
        self._clock = clock
        self._turns: OrderedDict[str, _Turn] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._turns)

    def configure(
        self, max_sessions: int, ttl_seconds: float, *, max_bytes: int | None = None
    ) -> None:
        """New limits (config reload); excess sessions are dropped, oldest first."""
        self._max, self._ttl = max_sessions, ttl_seconds
        if max_bytes is not None:
            self._max_bytes = max_bytes
        self._trim()

    def _trim(self) -> None:
        while self._turns and (len(self._turns) > self._max or self.bytes > self._max_bytes):
            _, oldest = self._turns.popitem(last=False)
            self.bytes -= oldest.bytes

    async def observe(
        self, plan: RoutePlan, body: Mapping[str, Any], body_bytes: int = 0
    ) -> PrefixBreak | None:
        """Keep this turn of the plan's session; the break from its previous turn, if any.
        `body_bytes`: the body's size as received (0: unknown, digested inline)."""
        session = plan.classification.session_id
        if session is None or self._max == 0:
            return None
        if body_bytes >= DIGEST_IN_THREAD_BYTES:
            digest = await asyncio.to_thread(digest_body, body)
        else:
            digest = digest_body(body)
        now = self._clock()
        turn = _Turn(
            keys=b"".join(k[:KEY_PREFIX_BYTES] for k in plan.keys.block_keys),
            block_tokens=plan.keys.block_tokens,
            digest=digest,
            seen_at=now,
        )
        turn.bytes = len(turn.keys) + len(session) + _digest_bytes(turn.digest) + _TURN_OVERHEAD
        prev = self._turns.pop(session, None)
        if prev is not None:
            self.bytes -= prev.bytes
        if turn.bytes <= self._max_bytes // 8:
            self._turns[session] = turn
            self.bytes += turn.bytes
            self._trim()
        if prev is None or now - prev.seen_at > self._ttl:
            return None
        common = _common_blocks(prev.keys, turn.keys)
        if common >= prev.blocks:
            return None
        _kind, difference = first_difference(prev.digest, turn.digest)
        path = difference.path if difference is not None else "template"
        brk = PrefixBreak(
            session=session,
            token_position=common * prev.block_tokens,
            previous_tokens=prev.blocks * prev.block_tokens,
            path=path[:MAX_PATH_CHARS],
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
