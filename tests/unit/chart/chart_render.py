"""Render charts/kvgate with the pinned helm (see helm_tool.py) for the chart tests.

`render(values)` runs `helm template` with the values given as a file and returns the parsed
documents; `helm(...)` runs any other helm command. Both fail the test with helm's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_tool import helm_binary

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "kvgate"
RELEASE = "kvgate"
NAMESPACE = "kvgate-system"
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
_TIMEOUT_SECONDS = 60


def helm_path() -> Path:
    """The helm binary, or skip (fail under CI) when it cannot be fetched."""
    try:
        return helm_binary()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"cannot get helm: {exc}")
        pytest.skip(f"cannot get helm: {exc}")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/kvgate-helm-cache"}
    result = subprocess.run(
        [str(helm_path()), *args],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_SECONDS,
        env=env,
        check=False,
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def template_text(
    values: dict[str, Any] | None = None,
    api_versions: Sequence[str] = (),
    *,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        json.dump(values or {}, f)
        values_file = f.name
    try:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", values_file]
        for api in api_versions:
            args += ["--api-versions", api]
        return helm(*args, check=check)
    finally:
        os.unlink(values_file)


_RENDERED: dict[str, str] = {}


def render(
    values: dict[str, Any] | None = None, api_versions: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The documents `helm template` renders for these values (rendered once per session)."""
    key = json.dumps([values or {}, list(api_versions)], sort_keys=True)
    if key not in _RENDERED:
        _RENDERED[key] = template_text(values, api_versions).stdout
    return [d for d in yaml.safe_load_all(_RENDERED[key]) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]
