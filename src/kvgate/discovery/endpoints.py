"""Endpoints (engine pods) the router knows, and their live state.

An `EndpointSpec` is what discovery reports: identity, URLs, generation. An `Endpoint` adds what
the router observes of the pod itself: load scraped from its /metrics, and health: failures in a
row eject a pod for a while, counted apart for its answers and for its /metrics (`FailureStreak`).
Only the router's routing core changes that state
(`kvgate.router.core.lifecycle`); the requests the router has in flight to each endpoint are its
own accounting (`kvgate.router.core.accounting`).

`EndpointSet` holds the endpoints of every pool. Discovery replaces one pool's list at a time;
the set diffs it against what it had and tells its listeners which endpoints came and went, so
that the indexer subscribes/unsubscribes and the directory clears departed pods at once.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EndpointSpec:
    """An engine pod as discovery sees it."""

    id: str  # directory pod identity: `<namespace>/<pod>` or `host:port`
    pool: str  # pool key `<namespace>/<name>`
    url: str  # http base URL without trailing slash
    kv_events: str | None = None  # ZMQ PUB endpoint; None = approximate mode
    kv_replay: str | None = None
    kv_topic: str = ""  # the topic the pod publishes KV events under (`kv_topic` below)
    generation: str = ""  # pod UID (+ engine epoch); a new one invalidates directory entries


def kv_topic(host: str, model: str) -> str:
    """The KV-event topic an engine at `host` serving `model` publishes: the operator renders
    `kv@$(POD_IP)@<served model name>` (IPv6 addresses without brackets, as $(POD_IP) has them)."""
    return f"kv@{host.removeprefix('[').removesuffix(']')}@{model}"


@dataclass
class LoadSample:
    """The pod's own view of its load, from /metrics."""

    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    scraped_at: float = 0.0  # monotonic seconds; 0 = never
    # vllm:lora_requests_info: adapters of the pod's running and of its waiting requests, and
    # how many a batch may use (0 = the pod reports no LoRA serving).
    running_lora_adapters: frozenset[str] = frozenset()
    waiting_lora_adapters: frozenset[str] = frozenset()
    max_lora: int = 0
    # vllm:cache_config_info: the KV cache's size in tokens (num_gpu_blocks x block_size; 0 =
    # not reported), and the tokens the engine has written into it since it started: prompt
    # tokens computed (vllm:prefix_cache_queries - vllm:prefix_cache_hits) and tokens generated
    # (vllm:generation_tokens); None = not reported.
    kv_capacity_tokens: int = 0
    kv_written_tokens: float | None = None

    @property
    def kv_filled(self) -> bool:
        """The engine has written at least its KV cache's size since it started: from then on,
        each token it writes evicts a block used earlier (vLLM frees the least recently used)."""
        written = self.kv_written_tokens
        return written is not None and 0 < self.kv_capacity_tokens <= written


@dataclass
class FailureStreak:
    """One health signal's failures in a row: `eject_after` of them put the pod out of rotation
    for `eject_seconds`, and each failure while it is out keeps it out that much longer."""

    failures_in_a_row: int = 0
    out_until: float = 0.0  # monotonic seconds

    def succeeded(self) -> None:
        self.failures_in_a_row = 0

    def recovered(self) -> None:
        """The pod is fine again now: the streak and any ejection it caused end."""
        self.failures_in_a_row = 0
        self.out_until = 0.0

    def failed(self, now: float, eject_after: int, eject_seconds: float) -> bool:
        """Count a failure; returns True when this failure ejects a pod that was in rotation."""
        if now < self.out_until:  # already out: keep it out, do not announce it again
            self.out_until = now + eject_seconds
            return False
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= eject_after:
            self.out_until = now + eject_seconds
            self.failures_in_a_row = 0
            return True
        return False


@dataclass
class Endpoint:
    spec: EndpointSpec
    load: LoadSample = field(default_factory=LoadSample)
    draining: bool = False  # leaving: no new requests, in-flight ones finish
    # The router's requests on the pod with no first byte yet when `load` was scraped: the
    # engine's waiting count then included them, not the ones sent or answered since.
    pending_at_scrape: int = 0
    # Passive health: the pod's answers. A failed attempt and a stream that broke are failures;
    # only a complete answer ends the streak, and only time ends the ejection (a pod whose
    # /metrics answers may still break every answer it starts).
    answers: FailureStreak = field(default_factory=FailureStreak)
    # Active health: its /metrics. An answer ends the streak and the ejection at once (a pod
    # that restarted is back as soon as it answers).
    scrapes: FailureStreak = field(default_factory=FailureStreak)
    # When the pod last gave a request of this router its first byte (the core's clock): a
    # hung engine gives none (`RoutingCore.cancelled`).
    first_byte_at: float = -math.inf
    # LoRA adapters the pod used last (sent by this router or seen running), oldest first, at
    # most its max_lora: vLLM keeps adapters in max_lora GPU slots and evicts the least recently
    # used, so these are the ones it most likely has loaded. An ordered set: a pod names up to
    # max_lora of them each scrape, so each name costs O(1) to note.
    _recent_lora: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)
    _recent_lora_set: frozenset[str] = field(default=frozenset(), init=False)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def pool(self) -> str:
        return self.spec.pool

    @property
    def ejected_until(self) -> float:
        """Monotonic seconds until which either health signal keeps the pod out of rotation."""
        return max(self.answers.out_until, self.scrapes.out_until)

    def healthy(self, now: float) -> bool:
        return now >= self.ejected_until

    def load_fresh(self, now: float, stale_after: float) -> bool:
        return self.load.scraped_at > 0 and now - self.load.scraped_at <= stale_after

    @property
    def recent_lora_adapters(self) -> frozenset[str]:
        """The adapters `note_lora_adapters` keeps, as every routing decision reads them: built
        when they change (at most once a scrape or a request), not per decision."""
        return self._recent_lora_set

    def note_lora_adapters(self, names: Iterable[str]) -> None:
        recent = self._recent_lora
        changed = False
        for name in names:
            if name in recent:
                recent.move_to_end(name)
            else:
                recent[name] = None
                changed = True
        for _ in range(len(recent) - max(1, self.load.max_lora)):
            recent.popitem(last=False)
            changed = True
        if changed:
            self._recent_lora_set = frozenset(recent)

    def lacks_lora_adapter(self, name: str) -> None:
        """The pod answered that it has not loaded adapter `name`."""
        if name in self._recent_lora:
            del self._recent_lora[name]
            self._recent_lora_set = frozenset(self._recent_lora)


def every_one_ejected(endpoints: Iterable[Endpoint], now: float) -> bool:
    """Every one of `endpoints` (at least one) is ejected: the router then fails open, in
    routing and in flow control alike, since trying a pod beats refusing every request (a
    pool whose /metrics all fail, or all slower than the scrape timeout, still serves)."""
    seen = False
    for ep in endpoints:
        if ep.healthy(now):
            return False
        seen = True
    return seen


Listener = Callable[[list[Endpoint], list[Endpoint]], Awaitable[None]]


class EndpointSet:
    """All endpoints, by pool. Not thread-safe: used from the event loop only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_pool: dict[str, dict[str, Endpoint]] = {}
        self._listeners: list[Listener] = []
        self._clock = clock

    def add_listener(self, listener: Listener) -> None:
        """`listener(added, removed)` is awaited after every change."""
        self._listeners.append(listener)

    def pools(self) -> list[str]:
        return list(self._by_pool)

    def in_pool(self, pool: str) -> list[Endpoint]:
        return list(self._by_pool.get(pool, {}).values())

    def all(self) -> list[Endpoint]:
        return [ep for eps in self._by_pool.values() for ep in eps.values()]

    def get(self, endpoint_id: str) -> Endpoint | None:
        for eps in self._by_pool.values():
            found = eps.get(endpoint_id)
            if found is not None:
                return found
        return None

    async def replace_pool(self, pool: str, specs: Iterable[EndpointSpec]) -> None:
        """Make `pool`'s endpoints exactly `specs`; keep live state of endpoints that stay."""
        current = self._by_pool.setdefault(pool, {})
        wanted = {s.id: s for s in specs}
        added: list[Endpoint] = []
        removed: list[Endpoint] = []
        for endpoint_id, ep in list(current.items()):
            spec = wanted.get(endpoint_id)
            if spec is None or spec != ep.spec:
                removed.append(current.pop(endpoint_id))
        for endpoint_id, spec in wanted.items():
            if endpoint_id not in current:
                ep = Endpoint(spec)
                current[endpoint_id] = ep
                added.append(ep)
        if added or removed:
            for listener in self._listeners:
                await listener(added, removed)

    async def drop_pool(self, pool: str) -> None:
        await self.replace_pool(pool, [])
        self._by_pool.pop(pool, None)
