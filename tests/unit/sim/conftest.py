"""Fixtures for the simulator's unit tests: small engines on the default profile."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgate.sim.engine import EngineConfig, SimEngine
from kvgate.sim.hashing import PrefixBlockHasher
from kvgate.sim.profile import H100_LLAMA3_8B

EngineFactory = Callable[..., SimEngine]


@pytest.fixture
def make_engine() -> EngineFactory:
    def build(**overrides: object) -> SimEngine:
        config = EngineConfig(**overrides)  # type: ignore[arg-type]
        hasher = PrefixBlockHasher("sha256", config.block_size, None)
        return SimEngine(config, H100_LLAMA3_8B, hasher)

    return build
