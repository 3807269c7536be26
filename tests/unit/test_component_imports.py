"""What importing a component's entry modules loads: the fast check behind the extras split
(tests/integration/test_component_installs.py proves it with real minimal installs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# module imported -> third-party modules it must not load
CASES = {
    "kvgate.prefix.hash_command": ["tokenizers", "jinja2", "msgpack", "zmq", "httpx"],
    "kvgate.prefix.diff_command": ["tokenizers", "jinja2"],
    "kvgate.operator.cleanup": ["zmq", "prometheus_client", "msgpack", "redis"],
    "kvgate.directory.redis": ["zmq", "prometheus_client", "msgpack"],
    "kvgate.router.command": ["matplotlib", "kopf", "rich"],
    "kvgate.sim.serve_command": ["redis", "kopf", "matplotlib", "httpx"],
}


@pytest.mark.parametrize(("module", "unwanted"), CASES.items())
def test_importing_loads_only_what_the_component_installs(module: str, unwanted: list[str]) -> None:
    code = (
        f"import sys, json, {module}; "
        f"print(json.dumps([m for m in {unwanted!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == []


def test_lazy_names_still_resolve() -> None:
    import kvgate.directory as directory
    import kvgate.prefix as prefix

    assert prefix.Tokenizer.__name__ == "Tokenizer"
    assert directory.RedisBlockIndex.__name__ == "RedisBlockIndex"
    for package in (prefix, directory):
        assert all(getattr(package, name) is not None for name in package.__all__)
    with pytest.raises(AttributeError):
        _ = prefix.NoSuchName  # type: ignore[attr-defined]
