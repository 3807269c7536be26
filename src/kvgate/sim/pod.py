"""One simulated vLLM pod: engine, wall-clock driver, metrics, KV event publisher, tokenizer.

The HTTP app (:mod:`kvgate.sim.server`) and the fleet build on this object; it owns every
background task it starts (engine loop, replay server) and stops them in :meth:`SimPod.close`.
"""

from __future__ import annotations

import time

import zmq.asyncio

from kvgate.sim.config import ServerConfig
from kvgate.sim.driver import EngineDriver
from kvgate.sim.engine import SimEngine, StepResult
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.metrics import PodMetrics
from kvgate.sim.profile import load_profile
from kvgate.sim.publisher import KVEventPublisher
from kvgate.sim.text import TextCodec, load_codec


class SimPod:
    def __init__(
        self,
        config: ServerConfig,
        zmq_context: zmq.asyncio.Context | None = None,
        codec: TextCodec | None = None,
    ) -> None:
        self.config = config
        self.profile = load_profile(config.profile)
        self.codec = codec or load_codec(config.tokenizer, config.model, config.engine.vocab_size)
        config.engine.vocab_size = self.codec.vocab_size  # generated ids stay decodable
        hasher = PrefixBlockHasher(config.hash_algo, config.engine.block_size, config.hash_seed)
        self.engine = SimEngine(config.engine, self.profile, hasher)
        self.created = int(time.time())
        self.metrics = PodMetrics(self.engine, config.served_model_name, self.cache_info())
        self.publisher: KVEventPublisher | None = None
        self._own_context = False
        if config.kv_events.enabled:
            if zmq_context is None:
                zmq_context = zmq.asyncio.Context()
                self._own_context = True
            self._zmq = zmq_context
            self.publisher = KVEventPublisher(
                config.kv_events,
                zmq_context,
                int_hashes=config.int_block_hashes,
                bind=config.kv_events_bind,
            )
        self.driver = EngineDriver(self.engine, config.time_scale, on_step=self._on_step)

    def cache_info(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info`."""
        e = self.config.engine
        return {
            "block_size": str(e.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(e.enable_prefix_caching),
            "gpu_memory_utilization": str(e.gpu_memory_utilization),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.engine.num_gpu_blocks),
            "num_gpu_blocks_override": str(e.num_gpu_blocks),
            "prefix_caching_hash_algo": self.config.hash_algo,
        }

    def _on_step(self, result: StepResult) -> None:
        self.metrics.observe_step(result)
        if self.publisher is not None:
            self.publisher.publish(result.events)

    def start(self) -> None:
        self.driver.start()
        if self.publisher is not None:
            self.publisher.start()

    def restart(self) -> None:
        """Simulate the engine process restarting (state lost, KV event seq back to 0)."""
        self.driver.restart()
        if self.publisher is not None:
            self.publisher.restart()

    async def close(self) -> None:
        await self.driver.stop()
        if self.publisher is not None:
            await self.publisher.close()
            if self._own_context:
                self._zmq.term()
