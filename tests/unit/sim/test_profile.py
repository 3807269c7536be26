from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.sim.profile import H100_LLAMA3_8B, load_profile


def test_default_profile_matches_published_h100_orders_of_magnitude() -> None:
    p = H100_LLAMA3_8B
    prefill_rate = 4096 / (p.step_seconds([(0, 4096)], []) - p.step_overhead_s)
    assert 20_000 < prefill_rate < 40_000  # tokens/s for an 8B model on one H100
    lone_decode = p.step_seconds([], [1000])
    assert 0.005 < lone_decode < 0.012
    assert p.kv_bytes_per_token == 128 * 1024
    blocks = p.num_gpu_blocks(16, 0.9)
    assert 300_000 < blocks * 16 < 500_000  # tokens of KV cache left after the weights


def test_step_time_grows_with_cached_context_and_batch() -> None:
    p = H100_LLAMA3_8B
    assert p.step_seconds([(8000, 1000)], []) > p.step_seconds([(0, 1000)], [])
    assert p.step_seconds([], [4000] * 256) > p.step_seconds([], [4000] * 8)
    assert p.step_seconds([], []) == 0.0


def test_profiles_load_by_name_or_from_json(tmp_path: Path) -> None:
    assert load_profile("h100-llama3-8b") is H100_LLAMA3_8B
    fields = {k: v for k, v in vars(H100_LLAMA3_8B).items() if k != "name"}
    fields["hbm_bytes_per_s"] = 8e12
    path = tmp_path / "b200.json"
    path.write_text(json.dumps(fields))
    custom = load_profile(str(path))
    assert custom.name == "b200"
    assert custom.step_seconds([], [100]) < H100_LLAMA3_8B.step_seconds([], [100])
    path.write_text(json.dumps({**fields, "bogus": 1}))
    with pytest.raises(ValueError, match="bogus"):
        load_profile(str(path))
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("no-such-profile")
