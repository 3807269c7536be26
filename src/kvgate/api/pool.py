"""The InferencePool custom resource: a fleet of vLLM engines serving one model.

The operator turns a pool into a Deployment of vLLM pods configured for prefix caching and KV
events, a Service and a PodDisruptionBudget (see :mod:`kvgate.operator.render`). Everything the
router must know to compute the engines' block hashes (block size, hash algorithm, hash seed,
tokenizer) is declared here once, and rendered into both the engine arguments and the router
configuration, so that the two can never disagree.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from kvgate.api.base import (
    INT32_MAX,
    ApiModel,
    Condition,
    EnvVar,
    IntOrPercent,
    JsonDict,
    ObjectName,
    PodTemplateOverrides,
    ResourceRequirements,
    cel,
    section,
)
from kvgate.api.router_config import HashAlgo

POOL_KIND = "InferencePool"
POOL_PLURAL = "inferencepools"
DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.33.0"
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# Flags the operator renders itself; extraArgs may not repeat them (the rendered values are what
# the router relies on to compute matching block hashes).
MANAGED_FLAGS = (
    "--model",
    "--served-model-name",
    "--port",
    "--block-size",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--prefix-caching-hash-algo",
    "--kv-events-config",
    "--enable-prompt-tokens-details",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--kv-offloading-backend",
    "--kv-offloading-size",
    "--enable-lora",
    "--lora-modules",
    "--max-loras",
    "--max-lora-rank",
)


class PoolClass(StrEnum):
    ONLINE = "online"
    BATCH = "batch"


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


def _managed_flags_rule() -> JsonDict:
    flags = ", ".join(f"'{f}'" for f in MANAGED_FLAGS)
    return cel(
        f"self.all(a, ![{flags}].exists(f, a == f || a.startsWith(f + '=')))",
        "extraArgs may not set flags kvgate manages (--model, --served-model-name, --port, "
        "--block-size, --enable-prefix-caching, --prefix-caching-hash-algo, --kv-events-config, "
        "--enable-prompt-tokens-details, --max-model-len, --gpu-memory-utilization, "
        "--max-num-seqs, --kv-offloading-backend, --kv-offloading-size, --enable-lora, "
        "--lora-modules, --max-loras, --max-lora-rank): use the matching spec.engine or "
        "spec.lora field instead",
    )


class EngineSettings(ApiModel):
    """vLLM engine settings rendered into `vllm serve` arguments."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxModelLen) || self.maxModelLen >= self.blockSize",
                    "maxModelLen must be at least blockSize",
                )
            ]
        }
    )

    block_size: int = Field(
        default=16,
        ge=1,
        le=256,
        description="KV cache block size in tokens (--block-size); a power of two, 1 to 256.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self in {list(BLOCK_SIZES)}",
                    "blockSize must be a power of two between 1 and 256 (vLLM's default is 16)",
                )
            ]
        },
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Maximum context length (--max-model-len)."
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Fraction of GPU memory vLLM may use (--gpu-memory-utilization), in (0, 1].",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Maximum sequences per scheduler step (--max-num-seqs)."
    )
    cpu_offload_gib: float | None = Field(
        default=None,
        gt=0.0,
        description="GiB of host memory for vLLM's CPU offloading tier of the KV cache "
        "(--kv-offloading-backend native --kv-offloading-size); the router then indexes that "
        "tier and prices its hits as copies back to the GPU. Unset: no offloading.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Further `vllm serve` arguments, appended verbatim; "
        "`--default-chat-template-kwargs` and `--reasoning-effort-map` among them reach the "
        "router too, which renders chat prompts as the engines do.",
        json_schema_extra={
            "items": {"type": "string", "maxLength": 1024},
            "x-kubernetes-validations": [_managed_flags_rule()],
        },
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="Extra environment variables of the engine container."
    )


class CacheSettings(ApiModel):
    """Prefix-cache hashing: what the router needs to compute the engines' block hashes."""

    hash_algo: HashAlgo = Field(
        default="sha256",
        description="Block hash algorithm (--prefix-caching-hash-algo); only the algorithms "
        "the router can reproduce exactly (xxhash seeds are random per vLLM process).",
    )
    hash_seed: int = Field(
        default=0,
        ge=0,
        le=4294967295,
        description="PYTHONHASHSEED of the engines; seeds the hash chain (NONE_HASH).",
    )
    cache_ops: bool = Field(
        default=False,
        description="The engines accept AKV cache ops (a request's `cache` field: drop, "
        "reposition), e.g. the simulator with --sim-akv in engine.extraArgs. Off: the router "
        "strips `cache` before forwarding (vLLM ignores it) and keys prompts without ops.",
    )


class TokenizerSource(ApiModel):
    """Where the router finds the pool's tokenizer; without one it routes on approximate blocks."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.path) && has(self.configMap))",
                    "give at most one of tokenizer.path and tokenizer.configMap",
                )
            ]
        }
    )

    path: str | None = Field(
        default=None,
        description="Directory inside the router image holding tokenizer.json (and a chat "
        "template).",
    )
    config_map: ObjectName | None = Field(
        default=None,
        description="ConfigMap holding tokenizer.json (and a chat template), mounted into the "
        "router.",
    )
    chat_template: str | None = Field(
        default=None,
        description="File name of the chat template inside the tokenizer directory; default: the "
        "template shipped with the tokenizer.",
    )
    approximate_chars_per_block: int | None = Field(
        default=None,
        ge=1,
        description="Characters per block in approximate mode (no tokenizer).",
    )


class LoraAdapterSpec(ApiModel):
    """One LoRA adapter the engines load at start (`--lora-modules name=path`)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[^=\s]+$",
        description="Adapter name: what clients put in the request's `model` field.",
    )
    path: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^=\s]+$",
        description="Where the engines load it from (a path in the pod or a Hugging Face id); "
        "vLLM hashes name and path into every block of the adapter's requests.",
    )


class LoraSettings(ApiModel):
    """Multi-LoRA serving: rendered as --enable-lora, --max-loras, --lora-modules."""

    adapters: list[LoraAdapterSpec] = Field(
        min_length=1,
        max_length=256,
        description="Adapters loaded at start.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.all(a, self.exists_one(b, a.name == b.name))",
                    "LoRA adapter names must be unique",
                )
            ]
        },
    )
    max_loras: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Adapters a batch may use at once (--max-loras; vLLM's default is 1); a "
        "request for another adapter waits for a slot.",
    )
    max_lora_rank: int | None = Field(
        default=None, ge=1, le=512, description="Largest adapter rank (--max-lora-rank)."
    )


class InferencePoolSpec(ApiModel):
    """Desired state of an InferencePool."""

    model: str = Field(
        min_length=1,
        description="Model to serve: a Hugging Face repository id or a path inside the image.",
    )
    served_model_name: str | None = Field(
        default=None,
        description="Name clients put in the request's `model` field; defaults to `model`.",
    )
    replicas: int = Field(default=1, ge=0, le=INT32_MAX, description="Number of engine pods.")
    pool_class: PoolClass = Field(
        default=PoolClass.ONLINE,
        description="Pool class: online (latency-sensitive) or batch (throughput; batch requests "
        "may borrow idle online capacity).",
    )
    image: str = Field(
        default=DEFAULT_ENGINE_IMAGE, min_length=1, description="Engine container image."
    )
    image_pull_policy: PullPolicy | None = Field(
        default=None,
        description="Image pull policy of the engines: Always, IfNotPresent or Never; unset: the "
        "cluster's default.",
    )
    command: list[str] = Field(
        default_factory=lambda: ["vllm", "serve"],
        min_length=1,
        description="Engine command; the rendered flags follow it.",
        json_schema_extra={"default": ["vllm", "serve"]},
    )
    engine: EngineSettings = section(EngineSettings, "vLLM engine settings.")
    cache: CacheSettings = section(CacheSettings, "Prefix-cache hashing settings.")
    tokenizer: TokenizerSource | None = Field(
        default=None, description="Tokenizer the router uses for this pool."
    )
    lora: LoraSettings | None = Field(
        default=None, description="LoRA adapters the engines serve besides the base model."
    )
    gpus: int = Field(
        default=1,
        ge=0,
        description="GPUs per pod (the nvidia.com/gpu limit); 0 for CPU or simulated engines.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Further compute resources of the engine container.",
    )
    pod: PodTemplateOverrides = Field(
        default_factory=PodTemplateOverrides,
        description="Labels, annotations, node selector and tolerations of the engine pods.",
    )
    max_unavailable: IntOrPercent = Field(
        default=1,
        description="Engine pods a voluntary disruption may take down at once (the PodDisruptionBudget's "
        'maxUnavailable): an integer count such as 1 or a string percentage such as "25%" '
        "(int-or-string, which kubectl explain shows as <Object>).",
    )

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model


class InferencePoolStatus(ApiModel):
    """Observed state of an InferencePool, computed from its Deployment."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation last reconciled."
    )
    replicas: int = Field(default=0, description="Engine pods that exist.")
    ready_replicas: int = Field(default=0, description="Engine pods that are ready.")
    updated_replicas: int = Field(default=0, description="Pods running the current template.")
    endpoints: int = Field(default=0, description="Ready endpoints the router can use.")
    selector: str = Field(default="", description="Label selector of the engine pods.")
    served_model_name: str = Field(default="", description="Model name the engines serve.")
    conditions: list[Condition] = Field(
        default_factory=list, description="The conditions Ready, Progressing and Degraded."
    )
    reason: str = Field(
        default="",
        description="Why it is (not) ready, in one word: the Degraded condition's reason while "
        "Degraded is True, else the Ready condition's (the Reason column of kubectl get).",
    )
