"""Performance profiles: how long one engine step takes on a given GPU and model.

A step runs a batch of sequences: some prefill a chunk of prompt tokens (attending to the
context already in their KV cache), the others decode one token each. The step time is

    step = overhead + max(compute, memory)
    compute = (2 * params * new_tokens + attention_flops) / (peak_flops * mfu)
    attention_flops = sum over prefill chunks of 4 * layers * hidden * chunk * (context + chunk / 2)
    memory  = (weight_bytes + kv_bytes_per_token * kv_tokens_read) / (hbm_bandwidth * bw_efficiency)

where ``new_tokens`` is every token computed in the step (prefill chunks and one per decoding
sequence) and ``kv_tokens_read`` is the context length of every sequence in the batch (its KV
cache is read once per step). Prefill-heavy steps are compute bound, decode steps are memory
bound: TTFT grows with uncached prompt tokens and falls when the prefix is cached, and a busy
pod's decode steps slow down with batch size and context length.

The default profile, ``h100-llama3-8b``, is one H100 SXM 80GB running Llama-3.1-8B in BF16:

- peak dense BF16 throughput 989 TFLOP/s, HBM3 bandwidth 3.35 TB/s, 80 GB memory
  (NVIDIA H100 Tensor Core GPU datasheet);
- 8.03e9 parameters, 32 layers, hidden size 4096, 8 KV heads of dimension 128
  (meta-llama/Llama-3.1-8B config.json), so 2 * 32 * 8 * 128 * 2 bytes = 128 KiB of KV per token
  and 16.06 GB of weights;
- model FLOPs utilisation 0.5 for prefill and 0.8 of peak bandwidth for decode: typical of vLLM
  measurements on H100 (prefill of an 8B model at roughly 30k tokens/s, a lone decode step about
  8 ms);
- 2 ms of fixed per-step overhead (scheduling, sampling, input preparation, kernel launches) as
  vLLM's own profiling of small decode batches shows;
- activations and CUDA graphs reserve 4 GiB besides the weights when sizing the KV cache from
  ``--gpu-memory-utilization``, as vLLM's memory profiling does for an 8B model;
- blocks of the CPU offloading tier come back over PCIe Gen5 x16 (64 GB/s per direction in the
  H100 datasheet) at 50 GB/s, what pinned host-to-device copies reach: 128 KiB a token is then
  ~380k tokens/s, about 12x the prefill rate (``load_seconds``).

Profiles are plain data: pass another name from :data:`PROFILES` or a JSON file of the fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class PerformanceProfile:
    """Hardware and model constants that turn a batch into a step time (seconds)."""

    name: str
    peak_flops: float  # FLOP/s, dense, at the serving precision
    mfu: float  # fraction of peak_flops reached by prefill
    hbm_bytes_per_s: float
    bandwidth_efficiency: float  # fraction of hbm_bytes_per_s reached by decode
    gpu_memory_bytes: float
    params: float
    weight_bytes: float
    layers: int
    hidden_size: int
    kv_bytes_per_token: int
    step_overhead_s: float
    activation_reserve_bytes: float
    host_to_device_bytes_per_s: float = 50e9  # CPU offloading tier -> GPU copies

    def load_seconds(self, tokens: int) -> float:
        """Time to copy `tokens` tokens of KV cache from the CPU offloading tier to the GPU."""
        return tokens * self.kv_bytes_per_token / self.host_to_device_bytes_per_s

    def num_cpu_blocks(self, block_size: int, offloading_gib: float) -> int:
        """Blocks of `--kv-offloading-size` GiB of host memory."""
        return int(offloading_gib * GIB // (self.kv_bytes_per_token * block_size))

    def step_seconds(
        self,
        prefill_chunks: list[tuple[int, int]],
        decode_contexts: list[int],
    ) -> float:
        """Time of one step.

        ``prefill_chunks`` holds ``(context_tokens_already_cached, chunk_tokens)`` per prefilling
        sequence; ``decode_contexts`` the context length of every decoding sequence.
        """
        if not prefill_chunks and not decode_contexts:
            return 0.0
        new_tokens = len(decode_contexts)
        attention_flops = 0.0
        kv_read_tokens = 0
        for context, chunk in prefill_chunks:
            new_tokens += chunk
            attention_flops += 4.0 * self.layers * self.hidden_size * chunk * (context + chunk / 2)
            kv_read_tokens += context
        for context in decode_contexts:
            attention_flops += 4.0 * self.layers * self.hidden_size * context
            kv_read_tokens += context
        compute = (2.0 * self.params * new_tokens + attention_flops) / (self.peak_flops * self.mfu)
        memory = (self.weight_bytes + self.kv_bytes_per_token * kv_read_tokens) / (
            self.hbm_bytes_per_s * self.bandwidth_efficiency
        )
        return self.step_overhead_s + max(compute, memory)

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        """KV cache blocks that fit in the memory vLLM may use, as vLLM sizes them."""
        budget = (
            self.gpu_memory_bytes * gpu_memory_utilization
            - self.weight_bytes
            - self.activation_reserve_bytes
        )
        blocks = int(budget // (self.kv_bytes_per_token * block_size))
        if blocks < 2:
            raise ValueError(
                f"no memory left for the KV cache with --gpu-memory-utilization "
                f"{gpu_memory_utilization} on profile {self.name}"
            )
        return blocks


H100_LLAMA3_8B = PerformanceProfile(
    name="h100-llama3-8b",
    peak_flops=989e12,
    mfu=0.5,
    hbm_bytes_per_s=3.35e12,
    bandwidth_efficiency=0.8,
    gpu_memory_bytes=80e9,
    params=8.03e9,
    weight_bytes=16.06e9,
    layers=32,
    hidden_size=4096,
    kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
    step_overhead_s=0.002,
    activation_reserve_bytes=4 * GIB,
)

PROFILES: dict[str, PerformanceProfile] = {H100_LLAMA3_8B.name: H100_LLAMA3_8B}
DEFAULT_PROFILE = H100_LLAMA3_8B.name


def load_profile(name_or_path: str) -> PerformanceProfile:
    """A profile by name (see :data:`PROFILES`) or from a JSON file of its fields."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown profile {name_or_path!r}: use one of {sorted(PROFILES)} or a JSON file"
        )
    data = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(PerformanceProfile)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"unknown profile fields {sorted(unknown)} in {path}")
    data.setdefault("name", path.stem)
    return PerformanceProfile(**data)
