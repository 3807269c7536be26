"""Where tests find a vLLM 0.33 wheel to read vLLM's own code from (never installed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def vllm_wheel() -> Path:
    """$KVGATE_VLLM_WHEEL, else /tmp/vllm/vllm-0.33.0-*.whl; skips the test when there is none."""
    env = os.environ.get("KVGATE_VLLM_WHEEL")
    wheels = [Path(env)] if env else sorted(Path("/tmp/vllm").glob("vllm-0.33.0-*.whl"))
    if not wheels or not wheels[0].exists():
        pytest.skip("no vLLM 0.33 wheel (set KVGATE_VLLM_WHEEL or pip download it to /tmp/vllm)")
    return wheels[0]
