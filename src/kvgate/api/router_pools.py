"""The pool sections of the router config: which engines a pool has, how the router finds them,
and what it must know of them to compute their block hashes exactly (`kvgate.api.router_config`
assembles the whole file from these and the other sections)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kvgate.api.secret_ref import SecretRef
from kvgate.api.sections import ConfigModel, RequestClass

HashAlgo = Literal["sha256", "sha256_cbor"]  # what kvgate can reproduce exactly


class TokenizerConfig(ConfigModel):
    """How the router turns a request into the token ids vLLM will see.

    With `path` (a directory holding tokenizer.json and, for chat, a chat template) the router
    tokenizes exactly like the engine. Without it the router runs in approximate mode: prompts are
    cut into blocks of `approximate_chars_per_block` characters, which predicts hits between
    requests sent through this router but cannot match KV events.
    """

    path: str | None = None
    chat_template: str | None = None  # file; default: the template shipped with the tokenizer
    # The engines' --default-chat-template-kwargs: under each request's chat_template_kwargs.
    default_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The engines' --reasoning-effort-map: a request's reasoning_effort rewritten before rendering.
    reasoning_effort_map: dict[str, str] = Field(default_factory=dict)
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
    # The engines' API key (`vllm serve --api-key`): sent as `Authorization: Bearer` on every
    # request the router makes to them (clients' requests, warm-ups, copies, relays). Read at
    # load and on every reload; an empty or unreadable one is a config error. None: no key.
    api_key: SecretRef | None = None


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
