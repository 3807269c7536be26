"""The router's typed configuration (the file `kvgate router --config` and `kvgate indexer` read).

The operator renders this from a RoutingPolicy and the InferencePools it selects into a
ConfigMap; a person writes the same YAML by hand for a static fleet. Every model forbids unknown
keys so that a typo fails at load instead of silently doing nothing, and every default lives here,
documented next to its field (docs/configuration.md is the prose version).

Secrets (API keys, the admin token, the Redis password, tenant salts) can be given inline, read
from a file (a mounted Kubernetes Secret) or from an environment variable: see `SecretRef`.

The pool sections (engines, tokenizer, endpoints) are in `kvgate.api.router_pools`.
The sections a RoutingPolicy also carries (classes, borrowing, policy, sessions, tenants,
directory) are defined once in `kvgate.api.sections` (tenants and directory in `tenants.py` and
`directory_settings.py`); this module adds the router-only sections
and names the shared ones with the router's `SecretRef`. Field names are snake_case; their
camelCase spelling (the CRD's) is accepted too.

The policy's `params` is a plain mapping here because `kvgate.api` imports nothing else of ours;
the router validates it against `kvgate.scoring`'s registry when it loads the file.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, model_validator

from kvgate.api.directory_settings import DirectorySettings, RedisSettings
from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
from kvgate.api.router_pools import (
    EndpointsConfig,
    EngineConfig,
    HashAlgo,
    KubernetesDiscovery,
    LoraAdapter,
    PoolConfig,
    PortNames,
    StaticEndpoint,
    TokenizerConfig,
)
from kvgate.api.secret_ref import SecretRef
from kvgate.api.sections import (
    BorrowingConfig,
    CacheOpsConfig,
    ClassesConfig,
    ClassRule,
    ConfigModel,
    FlowControlConfig,
    PolicyConfig,
    RequestClass,
    SessionsConfig,
)
from kvgate.api.tenants import TenantSettings, TenantsSettings

__all__ = [
    "AdminConfig",
    "BorrowingConfig",
    "CacheOpsConfig",
    "ClassRule",
    "ClassesConfig",
    "DirectoryConfig",
    "EndpointsConfig",
    "EngineConfig",
    "FlowControlConfig",
    "HashAlgo",
    "KubernetesDiscovery",
    "KvEventsConfig",
    "LimitsConfig",
    "LoadMetricsConfig",
    "LoadSharingConfig",
    "LoraAdapter",
    "PolicyConfig",
    "PoolConfig",
    "PortNames",
    "RedisConfig",
    "RequestClass",
    "RouterConfig",
    "SecretRef",
    "ServerConfig",
    "SessionsConfig",
    "StaticEndpoint",
    "TenantConfig",
    "TenantsConfig",
    "TokenizerConfig",
    "WarmupConfig",
    "load_router_config",
    "parse_router_config",
]


# ---------------------------------------------------------------------------------------------
# Sections shared with the RoutingPolicy CRD (kvgate.api.sections), with the router's secrets

TenantConfig = TenantSettings[SecretRef]
TenantsConfig = TenantsSettings[SecretRef]
RedisConfig = RedisSettings[SecretRef, SecretRef]


class KvEventsConfig(ConfigModel):
    """Bounds on what a pod's KV-event stream can cost the indexer (docs/directory.md). Router
    config only: pods the operator runs use vLLM's defaults, so the CRD does not carry them."""

    # vLLM's `buffer_steps` (its replay buffer holds that many batches): a seq gap larger than
    # this cannot be replayed, so the pod is cleared and followed from the new seq at once.
    replay_buffer_steps: int = Field(default=10_000, ge=1)
    # One replay, end to end (receiving and applying): past it an incomplete replay is given up.
    replay_timeout_seconds: float = Field(default=5.0, gt=0)
    # Payload bytes one replay may bring; past it the replay is incomplete.
    replay_max_bytes: int = Field(default=128 * 1024 * 1024, ge=1)
    # A larger ZMQ message drops the connection (ZMQ_MAXMSGSIZE); vLLM batches are ~10-1000 KB.
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # Bytes queued per subscription before ZMQ drops new messages; a drop is a seq gap, which
    # the replay buffer covers. ZMQ bounds its queue in messages (ZMQ_RCVHWM), so this allows
    # as many as fit at `max_message_bytes` each (at least 1): 128 by default, more than an
    # engine publishes (one batch a step, ~100 a second) while one directory call times out.
    receive_queue_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)

    @property
    def receive_queue_messages(self) -> int:
        """ZMQ_RCVHWM: `receive_queue_bytes` of messages as large as allowed."""
        return max(1, self.receive_queue_bytes // self.max_message_bytes)


class DirectoryConfig(DirectorySettings[SecretRef, SecretRef]):
    """The directory section of the router config: the RoutingPolicy's, plus KV-event bounds."""

    kv_events: KvEventsConfig = KvEventsConfig()


class KeyingConfig(ConfigModel):
    """Turning prompts into block keys without stalling the event loop (`router/core/keying.py`).

    Prompts of up to `inline_max_chars` characters (at most ~3 ms of work, less for text the
    tokenizer has seen) are keyed on the event loop; larger ones in a pool of `workers` threads
    (tokenization releases the GIL). While every worker is busy, a large prompt that would bring
    the characters of the prompts in hand (keyed or waiting) over `max_waiting_chars` is refused
    with 503.
    """

    inline_max_chars: int = Field(default=8 * 1024, ge=0)
    workers: int = Field(default=2, ge=1)
    # ~6 s of tokenization for two workers: what a prompt may wait behind before it is refused.
    max_waiting_chars: int = Field(default=32 << 20, ge=0)
    # The router refuses (400 `prompt_too_long`) prompts of more tokens, whatever the pools'
    # `max_model_len`: what one prompt may cost it (tokenizing takes ~300 bytes a token for a
    # moment). None: only the pools' limits (a 16 MB prompt then needs gigabytes briefly).
    max_prompt_tokens: int | None = Field(default=1 << 20, ge=1)


# ---------------------------------------------------------------------------------------------
# Admin, limits, load metrics, server


class AdminConfig(ConfigModel):
    # Bearer token for /admin/*; None disables the admin API. Read at load and on every reload:
    # a token that is empty, unreadable or also a tenant API key is a config error (the router
    # refuses to start; a reload keeps the previous config), never an open or broken API.
    token: SecretRef | None = None


class LimitsConfig(ConfigModel):
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)  # over: 413
    # Arrays/objects nested deeper than this are a 400, checked on the raw bytes before any
    # recursive code (json, templates, digests) sees the body. Real requests nest < 20 levels;
    # Python's own parsers fail near 1,000.
    max_json_depth: int = Field(default=64, ge=2, le=256)
    connect_timeout_seconds: float = Field(default=2.0, gt=0)
    # Includes queue + prefill. A whole (non-stream) answer's head comes once it is all
    # generated: it waits this plus max_answer_seconds, and is not retried on another pod.
    first_byte_timeout_seconds: float = Field(default=600.0, gt=0)
    # Between chunks of a pod's answer once it started (a stream, or a whole answer being read).
    read_timeout_seconds: float = Field(default=120.0, gt=0)
    # From an answer's first byte to its last: a pod that keeps sending a byte now and then,
    # each gap under read_timeout_seconds, must not hold its client forever.
    max_answer_seconds: float = Field(default=3600.0, gt=0)
    # A whole (non-stream) answer is held until its end before it goes to the client: past this
    # many bytes it is a 502 (not retried: another pod would write it again).
    max_response_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    max_retries: int = Field(default=2, ge=0)  # other pods tried when one fails before a byte
    max_connections_per_endpoint: int = Field(default=512, ge=1)
    # Health: this many failures in a row eject a pod for eject_seconds, counted apart for its
    # answers (failed before the first byte, or a stream broken after it) and its /metrics.
    eject_after_failures: int = Field(default=3, ge=1)
    eject_seconds: float = Field(default=5.0, gt=0)


class LoadMetricsConfig(ConfigModel):
    """Scraping vLLM /metrics for load and active health."""

    scrape_interval_seconds: float = Field(default=0.1, gt=0)
    scrape_timeout_seconds: float = Field(default=0.5, gt=0)
    stale_after_seconds: float = Field(default=2.0, gt=0)  # older load data counts as unknown
    path: str = "/metrics"
    # A larger page is a failed scrape, never parsed: pages are parsed on the event loop every
    # scrape (a 16 MiB one took seconds), and vLLM's is about 100 KiB.
    max_page_bytes: int = Field(default=2 * 1024 * 1024, ge=64 * 1024)


class ServerConfig(ConfigModel):
    """The listening socket and the limits every client connection lives under.

    Read once at start (a reload does not change them). Over-limit clients get a clean HTTP
    answer (431, 408, 503) and the connection is closed; see docs/security.md.
    """

    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=0, le=65535)
    access_log: bool = False  # one key=value log line per request (logger kvgate.router.requests)
    # Request line + headers, in bytes, counted as they arrive; over: 431.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    # From a request's first byte to the end of its headers; over: 408 (slowloris).
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    # From the end of the headers to the end of the body; over: 408.
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    # A connection (new, or kept alive after a response) with no request for this long is closed.
    idle_timeout_seconds: float = Field(default=15.0, gt=0)
    # A client whose answer waits in its send buffer and that reads under 16 KiB of it in this
    # long is cut off, its request ended as if it had left (a slow reader holds no pod forever).
    write_stall_timeout_seconds: float = Field(default=60.0, gt=0)
    # Concurrent client connections. The router also keeps it below the open-files limit:
    # at most (RLIMIT_NOFILE - reserved_file_descriptors) / 2, since each active client
    # connection may hold one pod connection. At the cap the oldest idle keep-alive connection
    # is closed to admit a new one; with none idle, new connections get a 503.
    max_connections: int = Field(default=2048, ge=1)
    # File descriptors kept out of the connection budget: listener, Redis, ZMQ, scrapes, files.
    reserved_file_descriptors: int = Field(default=64, ge=0)
    # SIGTERM: stop accepting, let requests finish for this long, then end each stream still
    # open with an OpenAI error event (and answer 503 where no response has started). The pod's
    # terminationGracePeriodSeconds must be larger (the operator renders grace + 15 s).
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    # Browser origins allowed to call the router (CORS: preflights answered, the response
    # headers a page may read exposed), e.g. ["https://chat.example"], or ["*"] as vLLM's
    # default --allowed-origins. Empty: no CORS headers (a browser page of another origin is
    # refused by the browser; put CORS at the ingress if it answers there).
    cors_allowed_origins: list[str] = Field(default_factory=list, max_length=64)


class RouterConfig(ConfigModel):
    """The whole router configuration."""

    server: ServerConfig = ServerConfig()
    pools: list[PoolConfig] = Field(min_length=1)
    classes: ClassesConfig = ClassesConfig()
    borrowing: BorrowingConfig = BorrowingConfig()
    flow_control: FlowControlConfig = FlowControlConfig()
    policy: PolicyConfig = PolicyConfig()
    sessions: SessionsConfig = SessionsConfig()
    cache_ops: CacheOpsConfig = CacheOpsConfig()
    keying: KeyingConfig = KeyingConfig()
    tenants: TenantsConfig = TenantsConfig()
    directory: DirectoryConfig = DirectoryConfig()
    admin: AdminConfig = AdminConfig()
    limits: LimitsConfig = LimitsConfig()
    load_metrics: LoadMetricsConfig = LoadMetricsConfig()
    warmup: WarmupConfig = WarmupConfig()
    load_sharing: LoadSharingConfig = LoadSharingConfig()

    @model_validator(mode="after")
    def _unique_pools(self) -> RouterConfig:
        keys = [p.key for p in self.pools]
        if len(set(keys)) != len(keys):
            raise ValueError("pool namespace/name pairs must be unique")
        if self.load_sharing.enabled is True and self.directory.backend != "redis":
            raise ValueError("load_sharing.enabled: true needs directory.backend: redis")
        if self.warmup.shared is True and self.directory.backend != "redis":
            raise ValueError("warmup.shared: true needs directory.backend: redis")
        return self

    @property
    def load_sharing_enabled(self) -> bool:
        """Whether this router exchanges load with its replicas: `load_sharing.enabled`, or where
        that is unset, whether the directory is the shared Redis one."""
        return self.load_sharing.active(shared_directory=self.directory.backend == "redis")

    @property
    def warmup_sharing_enabled(self) -> bool:
        """Whether this router shares warm-ups with its replicas: `warmup.shared`, or where that
        is unset, whether the directory is the shared Redis one (and warm-up is on)."""
        return self.warmup.sharing_active(shared_directory=self.directory.backend == "redis")


def parse_router_config(text: str) -> RouterConfig:
    """Parse YAML (or JSON) text. Raises ValueError (pydantic.ValidationError) on a bad config."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("router config must be a mapping")
    return RouterConfig.model_validate(data)


def load_router_config(path: str | Path) -> RouterConfig:
    return parse_router_config(Path(path).read_text(encoding="utf-8"))
