"""What this router has sent to each endpoint and not seen finish: in flight, pending prefill.

Per endpoint the routing core keeps:

- **in flight**: requests sent and not yet finished, failed or cancelled;
- **pending prefill**: requests sent whose prefill has not happened yet, with the uncached
  prompt tokens predicted for them. The cost model queues a new request behind this work;
- **in-flight blocks**: the prompt block keys of the requests in flight, counted per key. A pod
  computes and keeps every full block of a request it runs (running requests pin their blocks),
  but the directory learns of them only from the KV events of the step that computed them, which
  under load is seconds after the request was sent. Until then a request with the same prefix
  would look cold everywhere and be spread, recomputing the prefix once per pod; `held` lets
  routing see the blocks the pod will hold by the time the new request, queued behind, is
  prefilled. Bounded per endpoint (`MAX_INFLIGHT_BLOCKS`: past it, requests are counted without
  their keys).

A request leaves pending prefill at its first byte when it streams (the first token comes right
after the prefill). A non-streaming answer's first byte is its last, so such a request leaves
pending prefill at its predicted TTFT after it was sent, or when it ends if that is earlier.
That expiry is evaluated lazily against the core's clock when the endpoint is next looked at,
so the same accounting runs in real time and in the discrete-event benchmark's simulated time.

Only the routing core (`lifecycle.py`) calls `sent`, `prefill_done` and `done`; everything else
reads `load(endpoint_id, now)`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvgate.prefix import BlockKey

# In-flight block keys counted per endpoint (~70 bytes of dict entry each; the keys themselves
# are the requests' own): 2^18 blocks of 16 tokens are 4M tokens, ten times the KV cache of an
# 8B model on one H100 (24,625 blocks), so a pod cannot hold more of them at once anyway.
MAX_INFLIGHT_BLOCKS = 1 << 18


@dataclass(slots=True)
class _Account:
    in_flight: int = 0
    batch_in_flight: int = 0
    pending_requests: int = 0
    pending_tokens: int = 0
    # non-streaming attempts by expiry time: (release_at, tie-breaker, attempt)
    expiring: list[tuple[float, int, Attempt]] = field(default_factory=list)
    # prompt block key -> in-flight attempts whose prompt has it
    blocks: dict[BlockKey, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Attempt:
    """One try of a request on one endpoint, from sending it until it ends."""

    endpoint_id: str
    account: _Account = field(repr=False)  # the account it was counted in (not a later one)
    sent_at: float  # the core's clock
    uncached_tokens: int  # predicted at routing time
    queued_ahead: int  # this router's requests pending prefill on the endpoint when sent
    streaming: bool
    release_at: float  # when pending prefill expires without a first byte (inf when streaming)
    batch: bool = False  # a batch-class request
    block_keys: Sequence[BlockKey] = ()  # counted in the account's in-flight blocks
    first_byte_at: float | None = None
    prefill_pending: bool = True
    open: bool = True


class EndpointLoad(NamedTuple):
    """This router's own view of the load it put on one endpoint."""

    in_flight: int
    pending_prefill_requests: int
    pending_prefill_tokens: int
    batch_in_flight: int = 0  # of in_flight, the batch-class requests


_IDLE = EndpointLoad(0, 0, 0)


class Accounting:
    """The accounts of every endpoint this router has sent to. Not thread-safe (one loop)."""

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}
        self._order = itertools.count()

    def sent(
        self,
        endpoint_id: str,
        now: float,
        *,
        uncached_tokens: int,
        predicted_ttft_seconds: float,
        streaming: bool,
        batch: bool = False,
        block_keys: Sequence[BlockKey] = (),
    ) -> Attempt:
        """Count an attempt on `endpoint_id`; `block_keys`: its prompt's full blocks, which the
        endpoint will hold while it runs (see `held`)."""
        account = self._accounts.setdefault(endpoint_id, _Account())
        if account.expiring:
            self._expire(account, now)
        blocks = account.blocks
        if len(blocks) + len(block_keys) > MAX_INFLIGHT_BLOCKS:
            block_keys = ()
        for key in block_keys:
            blocks[key] = blocks.get(key, 0) + 1
        attempt = Attempt(
            endpoint_id=endpoint_id,
            account=account,
            sent_at=now,
            uncached_tokens=uncached_tokens,
            queued_ahead=account.pending_requests,
            streaming=streaming,
            release_at=float("inf") if streaming else now + max(0.0, predicted_ttft_seconds),
            batch=batch,
            block_keys=block_keys,
        )
        account.in_flight += 1
        account.batch_in_flight += batch
        account.pending_requests += 1
        account.pending_tokens += uncached_tokens
        if not streaming:
            heapq.heappush(account.expiring, (attempt.release_at, next(self._order), attempt))
        return attempt

    def prefill_done(self, attempt: Attempt) -> None:
        """The attempt's prefill is over (first byte of a stream, or its end)."""
        if attempt.prefill_pending:
            attempt.prefill_pending = False
            attempt.account.pending_requests -= 1
            attempt.account.pending_tokens -= attempt.uncached_tokens

    def done(self, attempt: Attempt) -> None:
        """The attempt ended (finished, failed or cancelled): it is no longer in flight."""
        if not attempt.open:
            return
        self.prefill_done(attempt)
        attempt.open = False
        account = attempt.account
        account.in_flight -= 1
        account.batch_in_flight -= attempt.batch
        blocks = account.blocks
        for key in attempt.block_keys:
            left = blocks[key] - 1
            if left:
                blocks[key] = left
            else:
                del blocks[key]
        attempt.block_keys = ()

    def held(self, keys: Sequence[BlockKey], endpoint_ids: Collection[str]) -> dict[str, int]:
        """For each endpoint with a match, how many leading blocks of `keys` the requests in
        flight on it carry (what it will hold once they are prefilled).

        Block keys are chained (each digests its whole prefix), so an account holding `keys[i]`
        holds `keys[0..i]` too (the request that brought it brought its prefix): the match is
        found by bisection, O(log n) per endpoint, even when every pod runs a 32k-token prompt."""
        out: dict[str, int] = {}
        if not keys:
            return out
        first = keys[0]
        accounts = self._accounts
        for endpoint_id in endpoint_ids:
            account = accounts.get(endpoint_id)
            if account is None or first not in account.blocks:
                continue
            blocks = account.blocks
            low, high = 1, len(keys)  # keys[low - 1] is held; find the last held one
            while low < high:
                mid = (low + high + 1) // 2
                if keys[mid - 1] in blocks:
                    low = mid
                else:
                    high = mid - 1
            out[endpoint_id] = low
        return out

    def carrying(self, endpoint_id: str, key: BlockKey) -> int:
        """How many requests in flight on the endpoint carry block `key` in their prompt (with
        chained keys: share the whole prefix it ends)."""
        account = self._accounts.get(endpoint_id)
        return 0 if account is None else account.blocks.get(key, 0)

    def load(self, endpoint_id: str, now: float) -> EndpointLoad:
        account = self._accounts.get(endpoint_id)
        if account is None:
            return _IDLE
        if account.expiring and account.expiring[0][0] <= now:  # hot path: one check
            self._expire(account, now)
        return EndpointLoad(
            account.in_flight,
            account.pending_requests,
            account.pending_tokens,
            account.batch_in_flight,
        )

    def loads(self, endpoint_ids: Iterable[str], now: float) -> list[EndpointLoad]:
        """`load` of each endpoint, in order (one call per decision, not one per endpoint)."""
        accounts = self._accounts
        out: list[EndpointLoad] = []
        for endpoint_id in endpoint_ids:
            account = accounts.get(endpoint_id)
            if account is None:
                out.append(_IDLE)
                continue
            if account.expiring and account.expiring[0][0] <= now:
                self._expire(account, now)
            out.append(
                EndpointLoad(
                    account.in_flight,
                    account.pending_requests,
                    account.pending_tokens,
                    account.batch_in_flight,
                )
            )
        return out

    def forget(self, endpoint_id: str) -> None:
        """The endpoint left. Attempts still open on it end in their own (dropped) account, so
        an endpoint that rejoins under the same id starts from zero."""
        self._accounts.pop(endpoint_id, None)

    def _expire(self, account: _Account, now: float) -> None:
        expiring = account.expiring
        while expiring and expiring[0][0] <= now:
            attempt = heapq.heappop(expiring)[2]
            self.prefill_done(attempt)
