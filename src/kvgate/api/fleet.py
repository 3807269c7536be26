"""Configuration sections for a fleet that changes: warming pods that join, sharing load between
router replicas.

Same conventions as `kvgate.api.sections` (one model used by the router's YAML in snake_case and
by the RoutingPolicy's spec in camelCase; every default documented here; cross-field rules
written as a Python validator and as a CEL rule side by side).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from kvgate.api.base import cel
from kvgate.api.sections import ConfigModel


class WarmupConfig(ConfigModel):
    """Warm pods that join a pool (scale-up, restart, replacement) before they take full traffic.

    The router remembers the prompt prefixes its requests share most (by how often they were
    seen, decayed over time, times their length); a pod that joins a pool that already has pods
    gets the pool's top prefixes as `max_tokens: 1` requests, then its share of new requests
    ramps up linearly. A warm-up that has not finished by its timeout ends there: the pod ramps
    anyway. Needs exact block keys (a tokenizer, or token-id prompts): prefixes are re-sent as
    token ids.

    Router replicas on the Redis directory share warm-ups (`shared`): the first replica to
    claim a joining pod warms it, ranking the prefixes it knows by every replica's request
    counts (published every `share_interval_seconds`); the others hold the pod back until that
    warm-up is done (or their own `timeout_seconds` passes) and ramp as if they had warmed it.
    With Redis unreachable each replica warms the pod from its own history."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.topPrefixes) || !has(self.rememberedPrefixes) || "
                    "self.topPrefixes <= self.rememberedPrefixes",
                    "topPrefixes cannot exceed rememberedPrefixes",
                )
            ]
        }
    )

    enabled: bool = Field(default=True, description="Warm pods that join a pool.")
    top_prefixes: int = Field(
        default=8, ge=0, le=1024, description="Prefixes sent to a pod that joins (the hottest)."
    )
    remembered_prefixes: int = Field(
        default=256,
        ge=0,
        le=65_536,
        description="Prefixes remembered with their tokens (seen at least `minRequests` times), "
        "all pools together; the least recently seen go first.",
    )
    candidate_prefixes: int = Field(
        default=4096,
        ge=0,
        le=1_048_576,
        description="Prefixes seen fewer than `minRequests` times that are counted (keys only, "
        "~150 bytes each); the least recently seen go first.",
    )
    max_bytes: int = Field(
        default=16 << 20,
        ge=0,
        description="Bytes of token ids remembered (4 per token), all pools together.",
    )
    min_requests: int = Field(
        default=2, ge=1, description="Requests that must share a prefix before it is remembered."
    )
    min_tokens: int = Field(
        default=64, ge=1, description="Shorter prefixes are not worth a warm request."
    )
    half_life_seconds: float = Field(
        default=600.0, gt=0.0, description="How fast a prefix's request count decays."
    )
    concurrency: int = Field(
        default=4, ge=1, le=256, description="Warm requests in flight at once, per router."
    )
    timeout_seconds: float = Field(
        default=60.0,
        gt=0.0,
        description="Longest warm-up of one pod; then it ramps whatever is left unsent.",
    )
    ramp_seconds: float = Field(
        default=10.0,
        ge=0.0,
        description="After its warm-up, a pod's share of new requests grows linearly from 0 to "
        "full over this time (0: full share at once).",
    )
    shared: bool | None = Field(
        default=None,
        description="Router replicas warm a joining pod once, with the prefixes all of them "
        "see most (through the directory's Redis); unset: whenever the directory is Redis "
        "(true needs directory.backend: redis; false: each replica warms it on its own).",
    )
    share_interval_seconds: float = Field(
        default=5.0,
        gt=0.0,
        le=300.0,
        description="How often each replica publishes its hottest prefixes' request counts "
        "(block keys and counts, never tokens) and reads the other replicas'.",
    )

    def sharing_active(self, *, shared_directory: bool) -> bool:
        """Whether replicas share warm-ups, given whether they share a directory (Redis):
        `shared` where it is set, else whether they do; never with warm-up off."""
        return self.enabled and (shared_directory if self.shared is None else self.shared)

    @model_validator(mode="after")
    def _top_within_remembered(self) -> WarmupConfig:
        if self.top_prefixes > self.remembered_prefixes:
            raise ValueError("top_prefixes cannot exceed remembered_prefixes")
        return self


class LoadSharingConfig(ConfigModel):
    """Share each pod's load between router replicas behind one Service.

    Every `interval_seconds` each replica writes what it has in flight and pending prefill on
    each pod to the directory's Redis (one hash per pool, a field per replica stamped with
    Redis' clock) and reads the other replicas' fields in the same round trip; a decision adds
    what the others have queued on each pod to its own counts. Fields older than `ttl_seconds`
    are ignored and deleted, so a replica that stops is forgotten and, when Redis is down or
    slow (each exchange gives up after `timeout_seconds`), a replica routes on its own counts
    until Redis answers again.

    `enabled` unset (the default) means on exactly when `directory.backend` is redis: replicas
    that share a directory share their load too, and a replica with no peers pays one small
    round trip per pool per interval (~0.6% of a core per pool at 20 ms) and reads back nothing.
    `true` forces it on (an error without the Redis directory), `false` turns it off.
    `active()` is the one place that says which."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.ttlSeconds) || !has(self.intervalSeconds) || "
                    "self.ttlSeconds > self.intervalSeconds",
                    "ttlSeconds must be longer than intervalSeconds",
                )
            ]
        }
    )

    enabled: bool | None = Field(
        default=None,
        description="Exchange load with the other replicas; unset: whenever the directory is "
        "Redis (true needs directory.backend: redis; false turns it off).",
    )
    interval_seconds: float = Field(
        default=0.02, gt=0.0, le=10.0, description="How often loads are exchanged."
    )
    ttl_seconds: float = Field(
        default=1.0, gt=0.0, le=60.0, description="A replica's load older than this is ignored."
    )
    timeout_seconds: float = Field(
        default=0.05, gt=0.0, le=5.0, description="Longest wait for one exchange."
    )
    max_replicas: int = Field(
        default=64, ge=1, le=1024, description="Other replicas' loads read per exchange."
    )

    def active(self, *, shared_directory: bool) -> bool:
        """Whether replicas exchange load, given whether they share a directory (Redis):
        `enabled` where it is set, else whether they do."""
        return shared_directory if self.enabled is None else self.enabled

    @model_validator(mode="after")
    def _ttl_over_interval(self) -> LoadSharingConfig:
        if self.ttl_seconds <= self.interval_seconds:
            raise ValueError("ttl_seconds must be longer than interval_seconds")
        return self
