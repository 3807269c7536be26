"""The router's typed configuration (the file `kvgate router --config` and `kvgate indexer` read).

The operator renders this from a RoutingPolicy and the InferencePools it selects into a
ConfigMap; a person writes the same YAML by hand for a static fleet. Every model forbids unknown
keys so that a typo fails at load instead of silently doing nothing, and every default lives here,
documented next to its field (docs/configuration.md is the prose version).

Secrets (API keys, the admin token, the Redis password, tenant salts) can be given inline, read
from a file (a mounted Kubernetes Secret) or from an environment variable: see `SecretRef`.

The sections a RoutingPolicy also carries (classes, borrowing, policy, sessions, tenants,
directory) are defined once in `kvgate.api.sections` (tenants and directory in `tenants.py` and
`directory_settings.py`); this module adds the router-only sections
and names the shared ones with the router's `SecretRef`. Field names are snake_case; their
camelCase spelling (the CRD's) is accepted too.

The policy's `params` is a plain mapping here because `kvgate.api` imports nothing else of ours;
the router validates it against `kvgate.scoring`'s registry when it loads the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, field_validator, model_validator

from kvgate.api.directory_settings import DirectorySettings, RedisSettings
from kvgate.api.fleet import LoadSharingConfig, WarmupConfig
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

HashAlgo = Literal["sha256", "sha256_cbor"]  # what kvgate can reproduce exactly


class SecretRef(ConfigModel):
    """A secret value: exactly one of `value`, `file` (e.g. a mounted Secret key) or `env`."""

    value: str | None = None
    file: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        given = [x for x in (self.value, self.file, self.env) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of value, file, env")
        return self

    def read(self) -> str:
        """The secret's value; a file's trailing newline is stripped. Raises ValueError if unset."""
        if self.value is not None:
            return self.value
        if self.file is not None:
            try:
                return Path(self.file).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ValueError(f"cannot read secret file {self.file}: {exc}") from exc
        assert self.env is not None
        found = os.environ.get(self.env)
        if found is None:
            raise ValueError(f"environment variable {self.env} is not set")
        return found


# ---------------------------------------------------------------------------------------------
# Pools: engines, tokenizer, endpoints


class TokenizerConfig(ConfigModel):
    """How the router turns a request into the token ids vLLM will see.

    With `path` (a directory holding tokenizer.json and, for chat, a chat template) the router
    tokenizes exactly like the engine. Without it the router runs in approximate mode: prompts are
    cut into blocks of `approximate_chars_per_block` characters, which predicts hits between
    requests sent through this router but cannot match KV events.
    """

    path: str | None = None
    chat_template: str | None = None  # file; default: the template shipped with the tokenizer
    approximate_chars_per_block: int = Field(default=64, ge=1)
    # Approximate keys cover at most this many blocks (64 Ki blocks of 64 characters: 4 MiB).
    approximate_max_blocks: int = Field(default=65_536, ge=1)
    # What the router keeps per tokenizer (pools with the same engine settings share one), in
    # bytes. Segment cache: ids of pieces of text between added tokens (chat messages).
    segment_cache_bytes: int = Field(default=64 << 20, ge=0)
    # Recent prompts whose ids and digests a new prompt with the same prefix reuses.
    reuse_cache_bytes: int = Field(default=64 << 20, ge=0)
    # Block digests of aligned 512-token spans (the hasher's chain cache).
    hash_cache_bytes: int = Field(default=32 << 20, ge=0)


class EngineConfig(ConfigModel):
    """What the router must know about the pool's vLLM engines to compute their block hashes."""

    block_size: int = Field(default=16, ge=1)  # --block-size
    hash_algo: HashAlgo = "sha256"  # --prefix-caching-hash-algo
    hash_seed: str | None = None  # PYTHONHASHSEED; None = vLLM's default for the algorithm
    int_block_hashes: bool = False  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 on the engines
    # --max-model-len: prompts with more tokens are refused (400) before being tokenized whole.
    # None: unknown, the router refuses nothing on length (the engines still do).
    max_model_len: int | None = Field(default=None, ge=1)
    tokenizer: TokenizerConfig = TokenizerConfig()
    # Events publish real hashes; without them the router records what it routed, with a TTL.
    kv_events: bool = True
    # The engines accept AKV cache ops (the request's `cache` field: drop / reposition, e.g.
    # `kvgate sim serve --sim-akv`). Off: the router strips `cache` before forwarding, as vLLM
    # would ignore it, and keys the prompt without ops.
    cache_ops: bool = False
    # The engines offload KV blocks to CPU memory (vLLM `--kv-offloading-backend native
    # --kv-offloading-size GiB`): their CPU-tier events are indexed and a hit there is priced as
    # a copy back to the GPU (cost model `cpu_load_tokens_per_second`), cheaper than recomputing
    # and dearer than a GPU hit. False: only GPU blocks count; events of other media are skipped.
    cpu_offload: bool = False


class StaticEndpoint(ConfigModel):
    """One engine pod given by hand."""

    url: str  # base URL, e.g. http://10.0.0.5:8000
    id: str | None = None  # default: host:port of url
    kv_events: str | None = None  # tcp://host:5557 (ZMQ PUB); None = approximate for this pod
    kv_replay: str | None = None  # tcp://host:5558 (ZMQ ROUTER replay socket)
    # The topic the pod publishes its KV events under; messages of any other topic are dropped.
    # None: `kv@<url host>@<pool model>`, what the operator renders (`kv@$(POD_IP)@<model>`);
    # "" for an engine started with vLLM's default topic.
    kv_topic: str | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return url.rstrip("/")

    @field_validator("kv_events", "kv_replay")
    @classmethod
    def _zmq_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("ZMQ endpoint must start with tcp://, ipc:// or inproc://")
        return url

    @property
    def endpoint_id(self) -> str:
        if self.id:
            return self.id
        rest = self.url.split("://", 1)[1]
        return rest.split("/", 1)[0]


class PortNames(ConfigModel):
    """Port names of the pool's Service (the EndpointSlices carry them; a number, as a string,
    is taken as is); DESIGN.md §4 defaults."""

    http: str = "http"
    kv_events: str = "kv-events"
    kv_replay: str = "kv-replay"
    # Used when the EndpointSlices do not name the port.
    http_default: int = 8000
    kv_events_default: int = 5557
    kv_replay_default: int = 5558


class KubernetesDiscovery(ConfigModel):
    """Discover the pool's ready pods from the EndpointSlices of a Service (discovery.k8s.io/v1)."""

    namespace: str | None = None  # default: the pool's namespace
    service: str = Field(min_length=1, max_length=63)  # the Service selecting the engine pods
    ports: PortNames = PortNames()
    scheme: Literal["http", "https"] = "http"
    # Dual-stack Services have one slice per family; a pod reachable in both is used at this
    # family's address (None: IPv4 when it has one). The engines' KV-event topic holds their
    # primary pod IP, so set IPv6 in an IPv6-primary dual-stack cluster.
    ip_family: Literal["IPv4", "IPv6"] | None = None


class EndpointsConfig(ConfigModel):
    """Exactly one of `static` or `kubernetes`."""

    static: list[StaticEndpoint] | None = None
    kubernetes: KubernetesDiscovery | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EndpointsConfig:
        if (self.static is None) == (self.kubernetes is None):
            raise ValueError("give exactly one of endpoints.static or endpoints.kubernetes")
        return self


class LoraAdapter(ConfigModel):
    """A LoRA adapter the pool's engines serve (`vllm serve --lora-modules name=path`)."""

    name: str = Field(min_length=1)  # what clients send as `model`
    path: str = Field(min_length=1)  # the path the engines loaded: part of vLLM's block hash


class PoolConfig(ConfigModel):
    """An InferencePool as the router sees it."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    model: str = Field(min_length=1)  # the model name the engines serve (--served-model-name)
    served_model_names: list[str] = []  # extra names clients may use for this model
    pool_class: RequestClass = "online"
    engine: EngineConfig = EngineConfig()
    endpoints: EndpointsConfig
    lora_adapters: list[LoraAdapter] = []  # requests naming one are hashed with its LoRA key

    @property
    def key(self) -> str:
        """`<namespace>/<name>`: the directory's pool namespace (a Redis hash tag)."""
        return f"{self.namespace}/{self.name}"

    @property
    def model_names(self) -> list[str]:
        """Every name clients may send as `model`: the model, its aliases, its LoRA adapters."""
        names = [self.model, *self.served_model_names, *(a.name for a in self.lora_adapters)]
        return list(dict.fromkeys(names))

    def lora_for(self, model: str) -> LoraAdapter | None:
        return next((a for a in self.lora_adapters if a.name == model), None)


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
    # Messages queued per subscription before ZMQ drops new ones (ZMQ_RCVHWM); a drop is a seq
    # gap, which the replay buffer covers.
    receive_queue_messages: int = Field(default=1000, ge=1)


class DirectoryConfig(DirectorySettings[SecretRef, SecretRef]):
    """The directory section of the router config: the RoutingPolicy's, plus KV-event bounds."""

    kv_events: KvEventsConfig = KvEventsConfig()


class KeyingConfig(ConfigModel):
    """Turning prompts into block keys without stalling the event loop (`router/core/keying.py`).

    Prompts of up to `inline_max_chars` characters (about 1 ms of work) are keyed on the event
    loop; larger ones in a pool of `workers` threads (tokenization releases the GIL). A large
    prompt arriving while `workers + max_waiting` are already being keyed is refused with 503.
    """

    inline_max_chars: int = Field(default=64 * 1024, ge=0)
    workers: int = Field(default=2, ge=1)
    max_waiting: int = Field(default=64, ge=0)
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
    first_byte_timeout_seconds: float = Field(default=600.0, gt=0)  # includes queue + prefill
    read_timeout_seconds: float = Field(default=120.0, gt=0)  # between chunks once streaming
    max_retries: int = Field(default=2, ge=0)  # other pods tried when one fails before a byte
    max_connections_per_endpoint: int = Field(default=512, ge=1)
    # Passive health: this many consecutive failures ejects a pod for eject_seconds.
    eject_after_failures: int = Field(default=3, ge=1)
    eject_seconds: float = Field(default=5.0, gt=0)


class LoadMetricsConfig(ConfigModel):
    """Scraping vLLM /metrics for load and active health."""

    scrape_interval_seconds: float = Field(default=0.1, gt=0)
    scrape_timeout_seconds: float = Field(default=0.5, gt=0)
    stale_after_seconds: float = Field(default=2.0, gt=0)  # older load data counts as unknown
    path: str = "/metrics"


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
