"""What a benchmark sends: requests on an open-loop schedule and closed-loop sessions.

A workload is data, built once before any target runs, so that every target sees exactly the same
arrivals and bodies:

- ``requests``: open loop. Each :class:`BenchRequest` is sent at ``arrival_s`` seconds after the
  start, whether or not earlier requests have finished (Poisson or trace timestamps).
- ``sessions``: closed loop. A :class:`Session` starts at ``start_s`` and sends its turns one after
  the other: turn *k+1* is sent ``think_time_s`` seconds after turn *k*'s answer has arrived (the
  agent thinking or its tool running), with the whole history resent every turn.

Each request also carries ``prefix_units``: the token ids the pod will see (or, where the bench has
no tokenizer, a stand-in sequence with the same prefix structure). The report uses them to compute
the ideal hit-rate bound, i.e. the hit rate of one infinite cache that saw every request in order.
"""

from __future__ import annotations

import functools
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
PREVIOUS_RESPONSE = "<previous response>"
"""A session turn's `previous_response_id` until sent: the load generator puts there the id of
the answer to the session's turn before."""
MESSAGES = "/v1/messages"


@dataclass(frozen=True)
class BenchRequest:
    """One request: where it goes, what it says, when it is due."""

    request_id: str
    path: str  # COMPLETIONS or CHAT_COMPLETIONS
    body: dict[str, Any]  # the OpenAI body without `model` and `stream`, which targets add
    max_tokens: int
    prefix_units: Sequence[int]  # token ids (or stand-ins) for the ideal hit-rate bound
    arrival_s: float = 0.0  # open loop only: seconds after the start
    request_class: str = "online"  # "online" or "batch"
    session_id: str | None = None
    think_time_s: float = 0.0  # closed loop only: pause after this turn's answer
    api_key: str | None = None  # sent as `authorization: Bearer` (the router's tenant)


@dataclass(frozen=True)
class Session:
    """A closed-loop conversation: turns sent one after another."""

    session_id: str
    start_s: float
    turns: tuple[BenchRequest, ...]


@dataclass(frozen=True)
class Workload:
    """A named, fully materialised workload."""

    name: str
    requests: tuple[BenchRequest, ...] = ()
    sessions: tuple[Session, ...] = ()
    description: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def all_requests(self) -> Iterator[BenchRequest]:
        """Every request, open-loop ones first, then each session's turns in order."""
        yield from self.requests
        for session in self.sessions:
            yield from session.turns

    @property
    def size(self) -> int:
        return len(self.requests) + sum(len(s.turns) for s in self.sessions)

    def stretched(self, factor: float) -> Workload:
        """The same workload with every arrival, session start and think time x ``factor``.

        Used with a simulator time scale: a fleet running ``factor`` wall seconds per simulated
        second sees the same load, in simulated time, as the unstretched workload.
        """
        if factor == 1.0:
            return self
        return replace(
            self,
            requests=tuple(_stretch(r, factor) for r in self.requests),
            sessions=tuple(
                replace(
                    s, start_s=s.start_s * factor, turns=tuple(_stretch(t, factor) for t in s.turns)
                )
                for s in self.sessions
            ),
        )

    def nominal_duration_s(self) -> float:
        """Last open-loop arrival or session start (sessions then run on their own clock)."""
        last = [r.arrival_s for r in self.requests] + [s.start_s for s in self.sessions]
        return max(last, default=0.0)


def _stretch(request: BenchRequest, factor: float) -> BenchRequest:
    return replace(
        request, arrival_s=request.arrival_s * factor, think_time_s=request.think_time_s * factor
    )


def poisson_arrivals(count: int, rate_rps: float, rng: random.Random) -> list[float]:
    """``count`` arrival times of a Poisson process of ``rate_rps``, starting at 0."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    times: list[float] = []
    now = 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate_rps)
    return times


def random_tokens(rng: random.Random, count: int, vocab_size: int) -> list[int]:
    """``count`` token ids drawn uniformly from ``[FIRST_PLAIN_TOKEN, vocab_size)``."""
    return [rng.randrange(FIRST_PLAIN_TOKEN, vocab_size) for _ in range(count)]


# Low ids are often special tokens (BOS/EOS/padding) in real vocabularies: keep away from them.
FIRST_PLAIN_TOKEN = 1000


_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


@functools.cache
def _words() -> np.ndarray:
    """The 4-character word of each id modulo 36³ (3 base-36 digits and a space)."""
    return np.array(
        [(a + b + c + " ").encode() for a in _ALPHABET for b in _ALPHABET for c in _ALPHABET],
        dtype="S4",
    )


def token_text(tokens: Sequence[int]) -> str:
    """Text in which every token id is one 4-character word (3 base-36 digits and a space).

    Prompts are sent as text, not token ids, because routers that match prefixes on text (the
    SGLang router rejects token-id prompts) must see them too. The simulator's default codec
    turns each 4 characters into one token, so the pod sees exactly ``len(tokens)`` tokens and
    two prompts share a token prefix exactly when their texts share the matching prefix.
    Built in numpy: a trace's prompts are millions of tokens (one word at a time was 6% of a
    discrete-event run that never sends them).
    """
    words = _words()
    ids = np.asarray(tokens, dtype=np.int64) % len(words)
    return words[ids].tobytes().decode("ascii")


def exact_output_fields(max_tokens: int) -> dict[str, Any]:
    """Body fields that make a pod answer with exactly ``max_tokens`` tokens, greedily."""
    return {
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def completion_request(
    request_id: str,
    tokens: Sequence[int],
    max_tokens: int,
    arrival_s: float,
    *,
    request_class: str = "online",
    session_id: str | None = None,
) -> BenchRequest:
    """A `/v1/completions` request for the prompt ``tokens`` (sent as :func:`token_text`).
    The ids are kept 4 bytes each: a workload holds every request's prompt from the start, and
    as a tuple of ints a trace of 4,000 rows of 15k tokens held 2 GiB."""
    ids = tokens if isinstance(tokens, array) else array("I", tokens)
    body: dict[str, Any] = {"prompt": token_text(ids), **exact_output_fields(max_tokens)}
    return BenchRequest(
        request_id=request_id,
        path=COMPLETIONS,
        body=body,
        max_tokens=max_tokens,
        prefix_units=ids,
        arrival_s=arrival_s,
        request_class=request_class,
        session_id=session_id,
    )
