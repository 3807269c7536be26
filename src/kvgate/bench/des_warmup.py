"""Warm requests in the discrete-event bench: what `http/warmer.py` and `http/warm_sharing.py`
do live, for every router replica, in simulated time.

Each replica's core hands out its warm requests (`core.warmup.take`); they are sent to their
pods at most `warmup.concurrency` in flight per replica (as each live router's warmer sends
them) and answered into that core (`request_done`). Warm requests are not client requests: the
driver leaves them out of the records, and counts them (`sent`).

With shared warm-ups (several replicas, `warmup.shared` unset or true: the bench's one
directory stands for the shared Redis), the replicas claim and follow each joining pod through
`kvgate.directory.shared_warmup.MemoryWarmClaims` (the Redis claims' in-process twin, with no
delay), poll the claims they follow every `FOLLOW_POLL_SECONDS`, and exchange their hot
prefixes' counts every `warmup.share_interval_seconds`, through the same core calls as live.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kvgate.directory.shared_warmup import MemoryWarmClaims
from kvgate.router.core.lifecycle import RoutingCore
from kvgate.router.core.peer_prefixes import shared_prefix_limit
from kvgate.router.core.warmup_claims import DONE_GRACE_SECONDS, FOLLOW_POLL_SECONDS
from kvgate.router.core.warmup_pods import WarmRequest
from kvgate.sim.des import TraceRequest

Complete = Callable[[Coroutine[Any, Any, Any]], Any]


class DesWarmups:
    """Every replica's warm requests and, when shared, their claims (see the module docstring)."""

    def __init__(
        self,
        cores: list[RoutingCore],
        pod_index: Mapping[str, int],
        *,
        shared: bool,
        clock: Callable[[], float],
        complete: Complete,
    ) -> None:
        self.cores = cores
        self._pod_index = pod_index
        self.shared = shared
        self._complete = complete
        self._claims = MemoryWarmClaims(clock)
        self._queues: list[list[WarmRequest]] = [[] for _ in cores]
        self._in_flight = [0] * len(cores)
        self._warm: dict[str, tuple[WarmRequest, int, int]] = {}  # id -> (request, pod, replica)
        self._next_poll = float("-inf")
        self._next_publish = float("-inf")
        self.sent = 0
        for core in cores:
            core.warmup.shared = shared

    def pod_of(self, request_id: str) -> int | None:
        """The pod a warm request goes to (None: not a warm request)."""
        found = self._warm.get(request_id)
        return None if found is None else found[1]

    def tick(self, now: float, *, joined: bool = False) -> list[TraceRequest]:
        """Share what is due (at once when pods `joined`), then send what may go now."""
        if self.shared and now >= self._next_publish:
            self._publish(now)
        if self.shared and (joined or now >= self._next_poll):
            self._next_poll = now + FOLLOW_POLL_SECONDS
            for k, core in enumerate(self.cores):
                self._share(k, core, now)
        for k, core in enumerate(self.cores):
            self._queues[k].extend(core.warmup.take())
        return self._next(now)

    def done(
        self, request_id: str, now: float, *, ok: bool, prompt_tokens: int, send: bool = True
    ) -> list[TraceRequest]:
        """A warm request was answered (or refused); the warm requests that may go now (none
        unless `send`: then the next tick sends them)."""
        request, _, k = self._warm.pop(request_id)
        self._in_flight[k] -= 1
        self.cores[k].warmup.request_done(request, now, ok=ok, prompt_tokens=prompt_tokens)
        return self._next(now) if send else []

    def _share(self, k: int, core: RoutingCore, now: float) -> None:
        """One round of `http/warm_sharing.py` for replica `k`: claims, done marks, follows."""
        warmup, replica, claims = core.warmup, f"r{k}", self._claims
        warmup.claims.advance(now)
        for claim in warmup.claims.take():
            outcome, by = self._complete(
                claims.claim(
                    claim.endpoint_id,
                    claim.generation,
                    replica,
                    can_warm=claim.can_warm,
                    ttl_seconds=warmup.config.timeout_seconds,
                )
            )
            warmup.claims.claim_result(claim, outcome, now, warmed_by=by)
        for claim in warmup.claims.take_reports():
            self._complete(
                claims.done(
                    claim.endpoint_id, claim.generation, replica, grace_seconds=DONE_GRACE_SECONDS
                )
            )
        followed = warmup.claims.following()
        states = self._complete(claims.states([(c.endpoint_id, c.generation) for c in followed]))
        for claim, state in zip(followed, states, strict=True):
            warmup.claims.follow_result(claim, state, now)

    def _publish(self, now: float) -> None:
        """Every replica publishes its hottest prefixes' counts and reads the others'."""
        config = self.cores[0].warmup.config
        self._next_publish = now + config.share_interval_seconds
        limit = shared_prefix_limit(config)
        for pool in self.cores[0].endpoints.pools():
            published = {
                k: c.warmup.hot.shared_counts(pool, limit, now) for k, c in enumerate(self.cores)
            }
            for k, core in enumerate(self.cores):
                others = {f"r{j}": counts for j, counts in published.items() if j != k}
                core.warmup.peer_counts.update(pool, others, now)

    def _next(self, now: float) -> list[TraceRequest]:
        """Warm requests to send now, up to `warmup.concurrency` in flight per replica."""
        out = []
        for k, core in enumerate(self.cores):
            warmup, queue = core.warmup, self._queues[k]
            while queue and self._in_flight[k] < warmup.config.concurrency:
                request = queue.pop(0)
                deadline = warmup.request_deadline(request)
                if deadline is None or deadline <= now:  # its warm-up ended while this waited
                    warmup.request_done(request, now, ok=False)
                    continue
                body = request.body()
                request_id = f"warm-{self.sent}"
                self.sent += 1
                self._warm[request_id] = (request, self._pod_index[request.endpoint_id], k)
                self._in_flight[k] += 1
                out.append(
                    TraceRequest(request_id, now, body["prompt"], 1, body.get("cache_salt"), None)
                )
        return out
