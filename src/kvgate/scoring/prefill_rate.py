"""Online estimate of each pod's prefill rate (tokens per second).

Each observation is ``(tokens, seconds)``: prompt tokens the pod computed (not served from cache)
and the time it took, from one request's router-measured TTFT when the pod had nothing of this
router's queued ahead of it: ``(uncached tokens, ttft - overhead_seconds)``. (The engine's
``vllm:request_prefill_time_seconds_sum`` is no measure of a rate: it adds up each request's
prefill span, and requests that share a step's budget overlap, so under load it reads several
times too slow, and differently on each pod; the router then herded onto whichever pod looked
fastest.) The router prices every pod of a pool at one rate, the median of its pods' estimates
(`kvgate.router.core.routing`): the pods of a pool run one engine spec.

The estimate is an exponentially weighted mean of the observed *seconds per token*, each
observation weighted by its token count (a 30k-token prefill says more than a 20-token one):

    w     = 1 - (1 - alpha) ** (tokens / reference_tokens)
    spt  <- (1 - w) * spt + w * (seconds / tokens)
    rate  = clamp(1 / spt, min_tokens_per_second, max_tokens_per_second)

Averaging seconds per token (not tokens per second) keeps one tiny, noisy observation from
inflating the rate. Until a pod has ``min_observed_tokens`` tokens of evidence the estimator
returns ``None`` (the cost model then uses the mean rate of the pod's measured pool peers, else
its prior); observations shorter than
``min_observation_tokens`` or with non-positive time are ignored. No clock reads, no I/O: the
router owns one instance and feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class PrefillRateParams(BaseModel):
    """Parameters of the online prefill-rate estimator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.2, gt=0, le=1)
    """Weight of an observation of ``reference_tokens`` tokens."""
    reference_tokens: int = Field(default=4096, ge=1)
    min_observation_tokens: int = Field(default=64, ge=1)
    """Shorter observations are dominated by fixed overheads: ignored."""
    min_observed_tokens: int = Field(default=2048, ge=0)
    """Evidence needed before the estimate replaces the prior."""
    min_tokens_per_second: float = Field(default=100.0, gt=0)
    max_tokens_per_second: float = Field(default=1_000_000.0, gt=0)
    ttft_overhead_seconds: float = Field(default=0.005, ge=0)
    """Subtracted from a TTFT observation (network, scheduling, first decode step)."""


@dataclass(slots=True)
class _PodRate:
    seconds_per_token: float
    observed_tokens: int


class PrefillRateEstimator:
    """Per-pod EWMA of prefill rate. Not thread-safe; one per router process (or simulator)."""

    __slots__ = ("_pods", "params")

    def __init__(self, params: PrefillRateParams | None = None) -> None:
        self.params = params or PrefillRateParams()
        self._pods: dict[str, _PodRate] = {}

    def observe(self, endpoint_id: str, tokens: int, seconds: float) -> None:
        """Record that ``endpoint_id`` computed ``tokens`` prompt tokens in ``seconds``."""
        p = self.params
        if tokens < p.min_observation_tokens or not seconds > 0:
            return
        sample = seconds / tokens
        pod = self._pods.get(endpoint_id)
        if pod is None:
            self._pods[endpoint_id] = _PodRate(sample, tokens)
            return
        weight = 1.0 - (1.0 - p.alpha) ** (tokens / p.reference_tokens)
        pod.seconds_per_token += weight * (sample - pod.seconds_per_token)
        pod.observed_tokens += tokens

    def observe_ttft(
        self, endpoint_id: str, uncached_tokens: int, ttft_seconds: float, queued_ahead: int
    ) -> None:
        """Record a request's TTFT; only used when nothing was queued ahead of it on the pod."""
        if queued_ahead > 0:
            return
        self.observe(endpoint_id, uncached_tokens, ttft_seconds - self.params.ttft_overhead_seconds)

    def rate(self, endpoint_id: str) -> float | None:
        """Tokens per second, or None while the evidence is below ``min_observed_tokens``."""
        pod = self._pods.get(endpoint_id)
        p = self.params
        if pod is None or pod.observed_tokens < p.min_observed_tokens:
            return None
        raw = 1.0 / pod.seconds_per_token
        return min(p.max_tokens_per_second, max(p.min_tokens_per_second, raw))

    def forget(self, endpoint_id: str) -> None:
        """Drop a pod that left (a new pod with the same id starts from the prior)."""
        self._pods.pop(endpoint_id, None)

    def __contains__(self, endpoint_id: object) -> bool:
        return endpoint_id in self._pods
