"""Copies of a hot prefix that the router makes by itself: a decision's `copy` as a warm request.

A policy may propose, with a decision, to compute the request's prefix on another pod
(`Decision.copy`: `holder-load`'s background copies of a long prefix hot on its holder). The
client request goes where it was routed; the copy is a warm request (`/v1/completions`, the
prefix as token ids, `max_tokens: 1`, the request's model and cache salt) that the I/O side sends
like a joining pod's (`core/warmup.py` hands both out: the live router's `http/warmer.py`, or the
discrete-event bench).

With approximate keys (a pool without a tokenizer) a completion's text prompt is copied as
text: its first `blocks * block_chars` characters, cut back before the last space between two
letters in the last block (where the tokenizers in use start a pre-token, so the pod computes
the same tokens as for the whole prompt up to there; `kvgate.prefix.tokenizer`), and the
routing history records the blocks wholly before the cut. A chat prompt's text is not what the
engine tokenizes (its chat template is), so a chat prompt with approximate keys is not copied.

    proposed ──(ids or text known, this prefix not being copied, room)──> queued ──> sent ──> done

- At most `MAX_COPIES_IN_FLIGHT` per pool, and one per prefix (named by its pool and last block
  key) at a time: a burst proposes the same copy with each of its requests. Counted by each
  router replica on its own (with R replicas, up to R x that many).
- While in flight the copy counts on its pod like a request (`accounting.py`): one more request,
  its prefill tokens pending, and its blocks in flight, so the next decisions see the pod as
  holding the prefix once computed (queued behind that prefill) and propose no second copy there.
- A copy is abandoned `COPY_DEADLINE_SECONDS` after it was proposed, sent or not (the I/O side
  bounds its wait for a send slot and for the answer by that too): the burst it was for is
  likely over. Answered or not, the pod's count ends with `done`.

Plain synchronous code on the core's clock, like the rest of the core.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.prefix import BlockKey
from kvgate.prefix.token_count import LETTER_SPACE_LETTER
from kvgate.router.core.accounting import Accounting, Attempt
from kvgate.router.core.hot_prefixes import HotPrefix, token_array
from kvgate.router.core.routing import RoutePlan
from kvgate.router.core.warmup_pods import WarmRequest
from kvgate.router.metrics import RouterMetrics
from kvgate.scoring.base import PrefixCopy

MAX_COPIES_IN_FLIGHT = 2
"""Per pool: each copy is seconds of prefill on a pod the router chose to take load off."""
COPY_DEADLINE_SECONDS = 30.0


@dataclass(slots=True)
class _Copy:
    request: WarmRequest
    attempt: Attempt


class PrefixCopies:
    """The copies proposed and in flight (see the module docstring). Owned by the routing core."""

    def __init__(
        self,
        accounting: Accounting,
        metrics: RouterMetrics,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        self.accounting = accounting
        self.on_done = on_done
        self.metrics = metrics
        self._in_flight: dict[tuple[str, BlockKey], _Copy] = {}
        self._queue: list[WarmRequest] = []

    def __len__(self) -> int:
        return len(self._in_flight)

    def start(self, plan: RoutePlan, copy: PrefixCopy, now: float) -> int:
        """Queue `copy` (proposed with the plan's decision) if it may start; the number of the
        plan's blocks it computes (0: not started)."""
        keys = plan.keys
        blocks = copy.blocks
        if not keys.copyable or not 0 < blocks <= len(keys.block_keys):
            return 0
        tokens: array[int] | None = None
        text: str | None = None
        if keys.token_ids is not None:
            if blocks * keys.block_tokens > len(keys.token_ids):
                return 0
            tokens = token_array(keys.token_ids[: blocks * keys.block_tokens])
            if tokens is None:
                return 0
        else:
            assert keys.prompt_text is not None
            end = blocks * keys.block_chars
            text = keys.prompt_text[
                : _last_space_cut(keys.prompt_text, end - keys.block_chars, end)
            ]
            blocks -= 1  # the last block is cut before a space, or may end mid-word: not counted
            if blocks == 0:
                return 0
        pool = plan.pool.key
        name = (pool, keys.block_keys[blocks - 1])  # the last block the copy computes
        if name in self._in_flight or self.in_pool(pool) >= MAX_COPIES_IN_FLIGHT:
            self.metrics.child(self.metrics.prefix_copies, pool, "skipped").inc()
            return 0
        cls = plan.classification
        prefix = HotPrefix(
            pool, cls.model, cls.tenant, cls.cache_salt, name[1], tokens, 1.0, now, text=text
        )
        request = WarmRequest(
            copy.endpoint_id, pool, prefix, deadline=now + COPY_DEADLINE_SECONDS, copy=True
        )
        attempt = self.accounting.sent(
            copy.endpoint_id,
            now,
            uncached_tokens=copy.tokens,
            predicted_ttft_seconds=copy.seconds,
            streaming=False,
            block_keys=keys.block_keys[:blocks],
        )
        self._in_flight[name] = _Copy(request, attempt)
        self._queue.append(request)
        return blocks

    def in_pool(self, pool: str) -> int:
        return sum(1 for p, _ in self._in_flight if p == pool)

    def take(self) -> list[WarmRequest]:
        """The copies to send now (each exactly once)."""
        out, self._queue = self._queue, []
        return out

    def done(self, request: WarmRequest, *, ok: bool) -> None:
        """A copy was answered (`ok`: a 200), failed, timed out or was abandoned."""
        name = (request.pool, request.prefix.key)
        copy = self._in_flight.get(name)
        if copy is None or copy.request is not request:
            return
        del self._in_flight[name]
        self.accounting.done(copy.attempt)
        self.metrics.child(self.metrics.prefix_copies, request.pool, "ok" if ok else "error").inc()
        self.on_done()


def _last_space_cut(text: str, start: int, end: int) -> int:
    """The last position in ``[start, end)`` just before a space between two letters, else
    ``end`` (a block without one is cut where it ends)."""
    cut = end
    for found in LETTER_SPACE_LETTER.finditer(text, start, end + 1):  # its lookahead sees `end`
        cut = found.start()
    return cut
