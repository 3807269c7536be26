"""Each component runs from its own minimal install: `pip install kvgate[<extra>]` in a fresh venv.

For every component a new virtual environment gets kvgate's wheel (built once from this tree)
with that component's extra and nothing else. Then, inside it: the component's commands answer
`--help`, every module of the packages it runs imports, and the dependencies it must not drag in
(matplotlib and kopf in the router, ZMQ in the operator, ...) are absent. The wheels come from
the package index through pip's cache; without an index the test is skipped, saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 240


@dataclass(frozen=True)
class Component:
    extra: str | None
    commands: list[list[str]]
    packages: list[str]  # every module under these must import
    modules: list[str] = field(default_factory=list)  # and these single modules
    absent: list[str] = field(default_factory=list)  # distributions' import names


COMPONENTS = {
    "base": Component(
        None,
        [["hash", "--help"], ["prefix", "diff", "--help"], ["crds", "--help"]],
        ["kvgate.api"],
        ["kvgate.prefix.hash_command", "kvgate.prefix.diff_command", "kvgate.prefix.hashing",
         "kvgate.prefix.completion_prompt", "kvgate.promtext"],
        ["tokenizers", "jinja2", "msgpack", "zmq", "httpx", "redis", "prometheus_client",
         "uvicorn", "kopf", "matplotlib"],
    ),
    "router": Component(
        "router",
        [["router", "--help"], ["indexer", "--help"], ["events", "--help"]],
        ["kvgate.router", "kvgate.indexer", "kvgate.discovery", "kvgate.directory",
         "kvgate.scoring", "kvgate.kvevents", "kvgate.prefix", "kvgate.api"],
        ["kvgate.serving", "kvgate.promtext"],
        ["matplotlib", "kopf", "rich"],
    ),
    "operator": Component(
        "operator",
        [["operator", "--help"]],
        ["kvgate.operator", "kvgate.api"],
        ["kvgate.directory.redis"],
        ["zmq", "prometheus_client", "tokenizers", "uvicorn", "matplotlib"],
    ),
    "sim": Component(
        "sim",
        [["sim", "serve", "--help"], ["sim", "fleet", "--help"]],
        ["kvgate.sim", "kvgate.kvevents", "kvgate.prefix"],
        ["kvgate.serving"],
        ["redis", "kopf", "kubernetes_asyncio", "matplotlib", "httpx"],
    ),
    "bench": Component(
        "bench",
        [["demo", "--help"], ["bench", "--help"]],
        ["kvgate.bench"],
        [],
        ["kopf"],
    ),
}  # fmt: skip

# Runs inside the component's venv: imports everything listed, reports failures and presences.
CHECK = """
import importlib, importlib.util, json, pkgutil, sys
spec = json.loads(sys.argv[1])
failed = {}
names = list(spec["modules"])
for package in spec["packages"]:
    module = importlib.import_module(package)
    names += [m.name for m in pkgutil.walk_packages(module.__path__, package + ".")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
present = [n for n in spec["absent"] if importlib.util.find_spec(n) is not None]
print(json.dumps({"imported": len(names), "failed": failed, "present": present}))
"""


def _run(cmd: list[str], timeout: float = PIP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvgate's wheel, built once from this tree (skips when pip cannot reach an index)."""
    out = tmp_path_factory.mktemp("wheel")
    probe = _run(_pip("download", "--no-deps", "-q", "-d", str(out / "probe"), "hatchling"), 90)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"pip cannot reach a package index (or its cache has no wheels): {last}")
    built = _run(_pip("wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)))
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("kvgate-*.whl")
    return found


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_component_runs_from_its_own_install(name: str, wheel: Path, tmp_path: Path) -> None:
    component = COMPONENTS[name]
    env_dir = tmp_path / f"venv-{name}"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # the outer pip installs into it
    python = str(env_dir / "bin" / "python")
    requirement = f"kvgate[{component.extra}] @ {wheel.as_uri()}" if component.extra else str(wheel)
    installed = _run(_pip("--python", python, "install", "-q", "--no-compile", requirement))
    if installed.returncode != 0 and "Could not find a version" in installed.stderr:
        pytest.skip(f"pip cannot fetch {name}'s dependencies: {installed.stderr.splitlines()[-1]}")
    assert installed.returncode == 0, installed.stderr

    kvgate = str(env_dir / "bin" / "kvgate")
    for command in component.commands:
        ran = _run([kvgate, *command], timeout=60)
        assert ran.returncode == 0 and "usage:" in ran.stdout, (command, ran.stderr[-2000:])

    spec = {"packages": component.packages, "modules": component.modules,
            "absent": component.absent}  # fmt: skip
    checked = _run([python, "-c", CHECK, json.dumps(spec)], timeout=120)
    assert checked.returncode == 0, checked.stderr[-2000:]
    report = json.loads(checked.stdout)
    assert report["failed"] == {}, report["failed"]
    assert report["present"] == [], f"{name} installs what it does not run: {report['present']}"
    assert report["imported"] >= len(component.modules)


def test_base_install_hashes_blocks(wheel: Path, tmp_path: Path) -> None:
    """`kvgate hash` computes vLLM's block hashes from a bare install."""
    env_dir = tmp_path / "venv-hash"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    installed = _run(_pip("--python", python, "install", "-q", "--no-compile", str(wheel)))
    assert installed.returncode == 0, installed.stderr
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(list(range(40))))
    kvgate = str(env_dir / "bin" / "kvgate")
    ran = _run([kvgate, "hash", "--tokens-json", str(tokens), "--block-size", "16"], 60)
    assert ran.returncode == 0, ran.stderr
    from kvgate.prefix import BlockHasher

    digests = BlockHasher("sha256", 16, None).hash_blocks(list(range(40)))
    assert [d.hex() for d in digests] == [line.split()[-1] for line in ran.stdout.splitlines()]
