"""A router or indexer whose port is taken says so and exits, instead of running without a listener."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["router", "indexer"])
def test_port_in_use_is_a_clear_error(tmp_path, command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if command == "router":
            args = [
                "router",
                "--endpoint",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--port",
                str(port),
            ]
        else:
            config = tmp_path / "router.yaml"
            config.write_text(
                "pools:\n- name: p\n  model: m\n"
                "  endpoints: {static: [{url: 'http://127.0.0.1:9'}]}\n"
            )
            args = ["indexer", "--config", str(config), "--allow-memory", "--host", "127.0.0.1"]
            args += ["--port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "kvgate.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot listen on" in done.stdout and f":{port}: " in done.stdout, done.stdout
