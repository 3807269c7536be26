"""What the load generator measures for each request, and for itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds since the run started."""

    request_id: str
    request_class: str
    session_id: str | None
    scheduled_s: float  # when the schedule wanted it sent
    sent_s: float  # when it was sent (sent_s - scheduled_s = the generator's own lag)
    first_byte_s: float | None = None  # first chunk carrying generated text (TTFT)
    end_s: float | None = None
    status: int | None = None
    error: str | None = None
    endpoint: str | None = None  # x-kvgate-endpoint, where the target says
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    client: int = 0  # which load-generator process sent it (`clients.py`; 0 when only one)
    response_id: str | None = None  # a Responses API answer's id (a later turn may name it)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.end_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_byte_s is None else self.first_byte_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_byte_s is None or self.end_s is None or self.completion_tokens < 2:
            return None
        return (self.end_s - self.first_byte_s) / (self.completion_tokens - 1)

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.scheduled_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoadSample:
    """Requests a pod reported running and waiting (its own /metrics) at time ``t_s``."""

    t_s: float
    pod: str
    running: float
    waiting: float


@dataclass
class GeneratorHealth:
    """How far the load generator itself fell behind: if this grows, numbers measure the client."""

    max_send_lag_s: float = 0.0
    mean_send_lag_s: float = 0.0
    max_loop_lag_s: float = 0.0  # event-loop stall measured by a ticker
    late_sends: int = 0  # sent more than LATE_SEND_S after schedule
    # Each stall over LOOP_STALL_S: (when it ended, how long), seconds since the run started.
    loop_stalls: list[tuple[float, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def client_limited(self, requests: int) -> bool:
        """Whether the generator, not the target, set the pace of a run of ``requests``: its
        event loop stalled over LOOP_STALL_S, or more than 5% of the requests left late."""
        return self.max_loop_lag_s > LOOP_STALL_S or self.late_sends > requests // 20


LATE_SEND_S = 0.05
LOOP_STALL_S = 0.25
