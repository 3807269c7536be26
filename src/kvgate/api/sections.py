"""Configuration sections shared by the router's config file and the RoutingPolicy CRD.

Each section is one pydantic model, used twice: in the router's YAML (snake_case field names,
`kvgate.api.router_config.RouterConfig`) and in the RoutingPolicy's spec (camelCase aliases,
`kvgate.api.policy.RoutingPolicySpec`, whose CRD schema `kvgate crds` generates from these
models). Both spellings are accepted on input. A field added here therefore appears in the
router's configuration, in the CRD's schema with its description, default and constraints,
and in docs/crds.md at once. The `tenants` and `directory` sections follow the same rules in
modules of their own (`tenants.py`, `directory_settings.py`).

Sections holding secrets are generic in how a secret is named: the router reads
`SecretRef` (an inline value, a file or an environment variable), a RoutingPolicy names a key
of a Secret (`SecretKeyRef`) that the operator hands to the router as an environment variable.
Other data (a CA bundle) is a `SecretRef` for the router too, and a key of a Secret or of a
ConfigMap (`DataKeyRef`) in a RoutingPolicy, handed over the same way.

Every default lives here, documented in the field's description (docs/configuration.md is the
prose version). Cross-field rules are written twice, side by side: as a Python validator (the
router's file) and as a CEL rule (`kubectl apply` rejects a bad RoutingPolicy).
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kvgate.api.base import FreeForm, cel

RequestClass = Literal["online", "batch"]

#: How a section names a secret: `router_config.SecretRef` or `base.SecretKeyRef`.
SecretT = TypeVar("SecretT", bound=BaseModel)
#: How a section names data that need not be secret (a CA bundle): a `router_config.SecretRef`
#: in the router's file, a Secret or ConfigMap key (`base.DataKeyRef`) in a RoutingPolicy.
DataT = TypeVar("DataT", bound=BaseModel)


class ConfigModel(BaseModel):
    """Base of the router's configuration models: unknown keys are an error (a typo fails at
    load), values are immutable, field names are snake_case with camelCase aliases (the CRD's
    spelling), and both are accepted; errors name fields in snake_case."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        loc_by_alias=False,
    )


# ---------------------------------------------------------------------------------------------
# Request classes and batch borrowing


class ClassRule(ConfigModel):
    """A request-class rule: applies when every given condition holds; the first match wins."""

    request_class: RequestClass = Field(description="Class given to matching requests.")
    tenant: str | None = Field(default=None, description="Tenant name the request must have.")
    model: str | None = Field(default=None, description="Model the request must ask for.")
    header: str | None = Field(
        default=None, description="Header the request must carry (case-insensitive)."
    )
    header_value: str | None = Field(
        default=None, description="Required header value; unset means any value."
    )


class ClassesConfig(ConfigModel):
    """How requests are classified as online or batch: the first matching rule, else the
    tenant's class, else `default`. The class header may always lower a request to batch; it may
    raise one to online only for a tenant with `may_choose_class`, or (`header_may_raise`) for
    requests of no configured tenant, so a client cannot lift itself into the online pools."""

    default: RequestClass = Field(
        default="online", description="Class of requests no rule matches."
    )
    header: str | None = Field(
        default="x-kvgate-class",
        description="Header through which clients may ask for a class; empty disables it. It may "
        "always lower a request to batch; raise one to online only where allowed.",
    )
    header_may_raise: bool = Field(
        default=False,
        description="Requests of no configured tenant may use the header to ask for online "
        "(default false: the header only lowers priority).",
    )
    rules: list[ClassRule] = Field(
        default_factory=list, description="Rules tried in order; the first match wins."
    )

    @field_validator("header")
    @classmethod
    def _empty_header_disables(cls, header: str | None) -> str | None:
        return header or None


class BorrowingConfig(ConfigModel):
    """Batch borrowing limits: when batch requests may run on online pods (online traffic never
    waits behind batch). An online pod is borrowable only while all the limits hold."""

    enabled: bool = Field(default=True, description="Let batch requests borrow idle online pods.")
    max_waiting_requests: int = Field(
        default=0,
        ge=0,
        description="Batch requests may borrow an online pod only while at most this many "
        "requests wait there (vllm:num_requests_waiting); all three borrowing limits must hold.",
    )
    max_kv_cache_usage: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="Batch requests may borrow an online pod only while its KV cache usage "
        "(vllm:kv_cache_usage_perc) is at most this fraction, in [0, 1]; all three borrowing "
        "limits must hold.",
    )
    max_running_requests: int = Field(
        default=16,
        ge=0,
        description="Batch requests may borrow an online pod only while it runs fewer requests "
        "than this (running, or this router's in-flight if more); all three borrowing limits "
        "must hold.",
    )
    online_may_use_batch_pools: bool = Field(
        default=True, description="Online requests may use batch pools when no online pod is ready."
    )


class FlowControlConfig(ConfigModel):
    """Router-side flow control: requests wait in a bounded queue per pool and class while every
    pod they may use is saturated (and batch requests while no pod may take them), instead of
    being refused. A pod is saturated while, by its own scraped metrics, it has
    `max_waiting_requests` waiting or its KV cache is `max_kv_cache_usage` full, or while this
    router's requests on it not yet past their prefill reach `max_waiting_requests` or
    `max_pending_prefill_tokens` (what the router sent since the last scrape). Queued requests
    leave online before batch, then by their tenant's priority, then by start-time fair queueing
    over prompt tokens (a tenant's share is its weight), and within a tenant by arrival time
    plus `prefill_time_weight` times their predicted prefill time. A request that cannot start
    within its deadline is answered 429 with `retry-after`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.onlineMaxWaitSeconds) ? self.onlineMaxWaitSeconds : 30.0) <= "
                    "(has(self.maxDeadlineSeconds) ? self.maxDeadlineSeconds : 600.0) && "
                    "(has(self.batchMaxWaitSeconds) ? self.batchMaxWaitSeconds : 600.0) <= "
                    "(has(self.maxDeadlineSeconds) ? self.maxDeadlineSeconds : 600.0)",
                    "onlineMaxWaitSeconds and batchMaxWaitSeconds must not exceed "
                    "maxDeadlineSeconds",
                )
            ]
        }
    )

    enabled: bool = Field(
        default=True,
        description="Queue requests while their pods are saturated (false: send them anyway, "
        "and refuse batch requests no pod may take with 503).",
    )
    max_waiting_requests: int = Field(
        default=5,
        ge=1,
        description="A pod is saturated while this many requests wait on it "
        "(vllm:num_requests_waiting, or this router's requests not past their prefill); "
        "default 5, the Gateway API Inference Extension's queue-depth threshold.",
    )
    max_kv_cache_usage: float = Field(
        default=0.95,
        ge=0.0,
        le=1.0,
        description="...or while its KV cache usage (vllm:kv_cache_usage_perc) is at least this "
        "fraction (1 disables); default 0.95 (0.8, the Gateway API Inference Extension's, cost "
        "5% of batch throughput in docs/benchmarks.md).",
    )
    max_pending_prefill_tokens: int = Field(
        default=32_768,
        ge=1,
        description="...or while this router's requests on it not past their prefill hold this "
        "many uncached prompt tokens (an idle pod always takes one request); default 32768.",
    )
    fair_share_window_seconds: float = Field(
        default=10.0,
        ge=0.0,
        description="While several tenants sent requests within this many seconds, one holding "
        "more than its weighted share of the prompt tokens in flight keeps to its share of the "
        "pods, so its long prompts cannot occupy every pod (engines finish what they started "
        "first); 0 disables.",
    )
    prefill_time_weight: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description="Within a tenant, queued requests leave in order of arrival time plus this "
        "many times their predicted prefill time (uncached tokens on their best pod): a short "
        "or cached prompt passes a long one that arrived less than that much earlier, and a "
        "long one is passed for at most that long; 0 keeps arrival order.",
    )
    max_queued_requests: int = Field(
        default=1024,
        ge=0,
        description="Requests one queue (a pool and class) holds; past it: 429 queue_full.",
    )
    max_queued_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="Request body bytes all queues hold together; past it: 429 queue_full "
        "(default 256 MiB).",
    )
    online_max_wait_seconds: float = Field(
        default=30.0,
        gt=0.0,
        description="Deadline of an online request in the queue unless its header sets one.",
    )
    batch_max_wait_seconds: float = Field(
        default=600.0,
        gt=0.0,
        description="Deadline of a batch request in the queue unless its header sets one.",
    )
    deadline_header: str | None = Field(
        default="x-kvgate-deadline-ms",
        description="Header with a request's own queue deadline in milliseconds; empty "
        "disables it.",
    )
    max_deadline_seconds: float = Field(
        default=600.0,
        gt=0.0,
        description="The longest deadline a header may ask for (longer ones are cut to this).",
    )

    @field_validator("deadline_header")
    @classmethod
    def _empty_header_disables(cls, header: str | None) -> str | None:
        return header.lower() if header else None

    @model_validator(mode="after")
    def _waits_within_deadline(self) -> FlowControlConfig:
        if max(self.online_max_wait_seconds, self.batch_max_wait_seconds) > (
            self.max_deadline_seconds
        ):
            raise ValueError(
                "online_max_wait_seconds and batch_max_wait_seconds must not exceed "
                "max_deadline_seconds"
            )
        return self


# ---------------------------------------------------------------------------------------------
# Scoring policy and sessions


class PolicyConfig(ConfigModel):
    """The scoring policy (`scoring` in a RoutingPolicy): a name from kvgate.scoring's registry
    and its typed parameters (scorer weights, cost model)."""

    name: str = Field(
        default="kvgate", min_length=1, description="Policy name in kvgate's registry."
    )
    params: FreeForm = Field(
        default_factory=dict,
        description="Policy parameters (scorer weights, cost-model constants); validated against "
        "the policy's parameters when the router loads its configuration.",
    )
    max_affinity_wait_seconds: float = Field(
        default=5.0,
        ge=0.0,
        description="Hard cap on the queue delay accepted to reach a pod holding the prefix "
        "while a pod within it would give the first token sooner (default 5).",
    )
    seed: int | None = Field(
        default=None, description="Seed of randomised tie-breaking; unset: from the OS."
    )


class SessionsConfig(ConfigModel):
    """How a conversation is recognised across requests (for prefix-break detection)."""

    header: str | None = Field(
        default="x-session-id",
        description="Header carrying a session id; empty: only the OpenAI `user` field.",
    )
    use_openai_user: bool = Field(
        default=True,
        description="Use the OpenAI `user` field as a session id (on Anthropic's Messages API, "
        "`metadata.user_id`, which Claude Code sets per session).",
    )
    max_sessions: int = Field(default=10_000, ge=0, description="Sessions remembered (LRU).")
    ttl_seconds: float = Field(
        default=3600.0, gt=0.0, description="Idle time after which a session is forgotten."
    )
    max_id_chars: int = Field(
        default=128,
        ge=16,
        description="Longer session ids are replaced by a fixed-size digest of them (the same "
        "id still names the same session); default 128.",
    )
    max_state_bytes: int = Field(
        default=32 << 20,
        ge=0,
        description="Bytes of per-session state kept for prefix-break detection (each "
        "session's last turn), least recent dropped first; default 32 MiB.",
    )

    @field_validator("header")
    @classmethod
    def _empty_header_disables(cls, header: str | None) -> str | None:
        return header or None


class CacheOpsConfig(ConfigModel):
    """AKV cache ops the router adds for clients that send none (only toward pools whose
    engines accept them, `engine.cacheOps`)."""

    rolling_drop: bool = Field(
        default=False,
        description="Tool-response rolling drop: on a chat request without `cache`, keep every "
        "reasoning message and the last `keepToolResponses` tool responses (role `tool`), and "
        "drop the KV of older ones when a newer one arrives (default off).",
    )
    keep_tool_responses: int = Field(
        default=12,
        ge=0,
        le=4096,
        description="Tool responses whose KV the rolling drop keeps (default 12).",
    )
