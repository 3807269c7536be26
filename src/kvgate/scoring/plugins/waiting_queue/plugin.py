"""``waiting-queue`` scorer (balance): fewer engine-waiting requests is better, min-max scaled.

A re-implementation of the Gateway API Inference Extension's ``queue-scorer``
(kubernetes-sigs/gateway-api-inference-extension, ``pkg/epp/scheduling/framework/plugins/
scorer/queue.go``, 2025):

    score = (max_waiting - waiting) / (max_waiting - min_waiting)     (1 for all when equal)

``waiting`` is the engine's ``vllm:num_requests_waiting`` from the last scrape. A pod with no
fresh report (``EndpointSnapshot.engine`` is None) counts this router's requests pending prefill
instead (GIE would use its last scrape; kvgate's own count is the closest fresh view).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot
from kvgate.scoring.params import StrictParams


class WaitingQueueParams(StrictParams):
    pass


class WaitingQueueScorer:
    name = "waiting-queue"

    def __init__(self, params: WaitingQueueParams | None = None) -> None:
        self.params = params or WaitingQueueParams()

    def waiting(self, state: CycleState, endpoint: EndpointSnapshot) -> int:
        eng = endpoint.engine
        if eng is not None:
            return max(0, eng.waiting)
        return max(0, endpoint.pending_prefill_requests)

    def score(self, state: CycleState, candidates: Sequence[EndpointSnapshot]) -> list[float]:
        queues = [self.waiting(state, e) for e in candidates]
        if not queues:
            return []
        low, high = min(queues), max(queues)
        if high == low:
            return [1.0] * len(queues)
        return [(high - q) / (high - low) for q in queues]
