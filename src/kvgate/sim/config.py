"""The ``vllm serve`` flags the simulator accepts, plus its own ``--sim-*`` flags.

Only flags a kvgate operator renders (and a few harmless common ones) are accepted; argparse
rejects anything else, so a wrong rendered flag fails the pod at start as it would on vLLM.
``PYTHONHASHSEED`` (the hash seed vLLM reads) comes from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from kvgate.prefix import HASH_ALGOS, HashAlgo
from kvgate.sim.engine import EngineConfig
from kvgate.sim.lora import lora_config, parse_lora_module
from kvgate.sim.profile import DEFAULT_PROFILE


@dataclass
class KVEventsConfig:
    """vLLM's ``--kv-events-config`` (``vllm/config/kv_events.py``)."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


@dataclass
class ServerConfig:
    model: str = "sim-model"
    served_model_names: list[str] = field(default_factory=list)
    host: str = "0.0.0.0"
    port: int = 8000
    hash_algo: HashAlgo = "sha256"
    hash_seed: str | None = None
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    kv_events_bind: bool | None = None  # None: vLLM's rule (bind only wildcard endpoints)
    enable_prompt_tokens_details: bool = False
    tokenizer: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    profile: str = DEFAULT_PROFILE
    time_scale: float = 1.0
    chat_output_tokens: int = 64
    int_block_hashes: bool = False

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model


def parse_kv_events_config(text: str) -> KVEventsConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--kv-events-config is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("--kv-events-config must be a JSON object")
    known = set(KVEventsConfig.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown --kv-events-config keys: {sorted(unknown)}")
    cfg = KVEventsConfig(**data)
    if "publisher" not in data:
        cfg.publisher = "zmq" if cfg.enable_kv_cache_events else "null"
    if cfg.publisher not in ("null", "zmq"):
        raise argparse.ArgumentTypeError(f"unknown KV event publisher {cfg.publisher!r}")
    return cfg


def parse_human_int(text: str) -> int:
    """vLLM accepts ``32768``, ``32k`` (1000s), ``32K`` (1024s), ``1m``/``1M``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "K": 1024, "M": 1024**2, "G": 1024**3}[suffix]
    return int(number * scale)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError("must be in (0, 1]")
    return value


def add_vllm_arguments(parser: argparse.ArgumentParser, *, single_pod: bool = True) -> None:
    """Register the accepted ``vllm serve`` flags and the ``--sim-*`` flags."""
    defaults = EngineConfig()
    if single_pod:
        parser.add_argument("model_tag", nargs="?", help="model name (as `vllm serve MODEL`)")
        parser.add_argument("--host", default="0.0.0.0")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--kv-events-config", type=parse_kv_events_config, default=KVEventsConfig()
        )
    parser.add_argument("--model", default=None)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--tokenizer", default=None, help="directory with tokenizer.json")
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument("--prefix-caching-hash-algo", default="sha256")
    parser.add_argument("--max-model-len", type=parse_human_int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument(
        "--max-num-batched-tokens", type=parse_human_int, default=defaults.max_num_batched_tokens
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=_fraction, default=defaults.gpu_memory_utilization
    )
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        help="GiB of host memory for the CPU offloading tier of the KV cache",
    )
    parser.add_argument("--kv-offloading-backend", default=None, help="native (vLLM's own)")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=None)
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--disable-log-requests", action="store_true")
    parser.add_argument("--disable-log-stats", action="store_true")
    sim = parser.add_argument_group("simulator")
    sim.add_argument("--sim-profile", default=DEFAULT_PROFILE, help="profile name or JSON file")
    sim.add_argument("--sim-seed", type=int, default=None, help="output seed (default --seed)")
    sim.add_argument(
        "--sim-time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second (0.1 runs 10x faster than a real GPU)",
    )
    sim.add_argument(
        "--sim-chat-output-tokens",
        type=int,
        default=64,
        help="answer length of a chat request without max_tokens (where vLLM stops at EOS)",
    )
    sim.add_argument(
        "--sim-lora-load-seconds",
        type=float,
        default=0.05,
        help="simulated seconds to load a LoRA adapter into one of the --max-loras GPU slots",
    )


def config_from_args(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> ServerConfig:
    env = os.environ if environ is None else environ
    model = args.model or getattr(args, "model_tag", None) or "sim-model"
    if args.prefix_caching_hash_algo not in HASH_ALGOS:
        raise ValueError(
            f"--prefix-caching-hash-algo {args.prefix_caching_hash_algo!r}: the simulator "
            f"supports {list(HASH_ALGOS)} (xxhash seeds are random per process in vLLM)"
        )
    if args.sim_time_scale <= 0:
        raise ValueError("--sim-time-scale must be > 0")
    if args.tensor_parallel_size < 1:
        raise ValueError("--tensor-parallel-size must be >= 1")
    offloading = args.kv_offloading_size or 0.0
    if offloading < 0:
        raise ValueError("--kv-offloading-size must be >= 0")
    if args.kv_offloading_backend not in (None, "native"):
        raise ValueError(
            f"--kv-offloading-backend {args.kv_offloading_backend!r}: the simulator models "
            "vLLM's native CPU offloading only"
        )
    engine = EngineConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks_override,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len or EngineConfig().max_model_len,
        seed=args.seed if args.sim_seed is None else args.sim_seed,
        kv_offloading_size_gib=offloading,
        lora=lora_config(
            args.enable_lora, args.lora_modules, args.max_loras, args.sim_lora_load_seconds
        ),
    )
    kwargs: dict[str, Any] = {}
    if hasattr(args, "kv_events_config"):  # `serve`; a fleet sets these per pod
        kwargs.update(host=args.host, port=args.port, kv_events=args.kv_events_config)
    return ServerConfig(
        model=model,
        served_model_names=list(args.served_model_name or []),
        hash_algo=args.prefix_caching_hash_algo,
        hash_seed=env.get("PYTHONHASHSEED"),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        tokenizer=args.tokenizer,
        engine=engine,
        profile=args.sim_profile,
        time_scale=args.sim_time_scale,
        chat_output_tokens=args.sim_chat_output_tokens,
        int_block_hashes=env.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0") not in ("", "0"),
        **kwargs,
    )
