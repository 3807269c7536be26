"""Fixtures of the e2e suite (documented in tests/e2e/README.md).

When any test of tests/e2e is selected, the control plane is built (or reused from its cache)
right after collection, outside any test's timeout. The first test that asks for ``cluster``
starts a private cluster in its own network namespace; it is stopped as soon as the last e2e
test has run, so the rest of the session runs in the host namespace without the cluster's load.
On machines that cannot run it (not root, not Linux) the tests skip with the reason; under CI
(``CI`` set) they fail instead, because CI must run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, build, environment_problem

E2E_DIR = Path(__file__).resolve().parent
_cluster_key = pytest.StashKey[Cluster]()
_failed_key = pytest.StashKey[bool]()


def _is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(_is_e2e(item) for item in session.items):
        return
    if not os.environ.get("KVGATE_E2E_KUBECONFIG") and environment_problem() is None:
        build()


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.excinfo is not None and _is_e2e(item):
        item.config.stash[_failed_key] = True


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is not None and _is_e2e(nextitem):
        return
    _stop_cluster(item.config)


def _stop_cluster(config: pytest.Config) -> None:
    cluster = config.stash.get(_cluster_key, None)
    if cluster is None:
        return
    del config.stash[_cluster_key]
    keep = config.stash.get(_failed_key, False) or bool(os.environ.get("KVGATE_E2E_KEEP"))
    cluster.stop(keep_state=keep)
    if keep:
        print(f"\ne2e cluster state and logs kept in {cluster.state_dir}")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A running cluster; this process's main thread is inside its network namespace."""
    external = os.environ.get("KVGATE_E2E_KUBECONFIG")
    problem = None if external else environment_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"e2e cluster unavailable on CI: {problem}")
        pytest.skip(problem)
    config = request.config
    if _cluster_key not in config.stash:
        started = Cluster(external_kubeconfig=Path(external) if external else None)
        try:
            started.start()
        except BaseException:
            started.stop(keep_state=True)
            raise
        config.stash[_cluster_key] = started
    yield config.stash[_cluster_key]
    _stop_cluster(config)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh Kubernetes namespace for one test, deleted afterwards (without waiting)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> list[str]:
    """kvgate's CRDs (crds/*.yaml, or $KVGATE_E2E_CRDS_DIR) applied with kubectl and
    Established; returns their names."""
    names = []
    crd_dir = Path(os.environ.get("KVGATE_E2E_CRDS_DIR") or E2E_DIR.parents[1] / "crds")
    for path in sorted(crd_dir.glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names.append(
            path.name.split("_", 1)[1].removesuffix(".yaml") + "." + path.name.split("_", 1)[0]
        )
    cluster.kubectl(
        "wait",
        "--for",
        "condition=Established",
        "--timeout",
        "60s",
        *[f"crd/{n}" for n in names],
        timeout=90,
    )
    return names
