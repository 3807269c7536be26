"""A newcomer's path, run from the docs themselves: the commands cannot drift from what works.

docs/playground.md and docs/install.md each mark a stretch of their text with
``<!-- e2e: ... -->`` comments; every ``sh`` block in it runs here verbatim, in order, in one bash
(``set -euo pipefail``) inside the cluster's network namespace, from the repository's root, as a
reader in the doc's namespace shell would run them. The cluster starts without kvgate's CRDs or
release, as a new cluster would; each test leaves it that way again (the CRDs excepted: they are
kept on uninstall, as the chart promises, for the tests that follow).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster
from tests.unit.chart.helm_tool import helm_binary

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BEGIN = "<!-- e2e: tests/e2e/test_docs.py runs every sh block from here"
END = "<!-- e2e: end -->"
CRDS = ["inferencepools.kvgate.io", "routingpolicies.kvgate.io"]
RELEASE, RELEASE_NAMESPACE = "kvgate", "kvgate-system"  # as the docs name them


def documented_commands(doc: str) -> list[str]:
    """The ``sh`` blocks between the doc's e2e markers."""
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    begin = text.index(BEGIN)
    stretch = text[begin : text.index(END, begin)]
    blocks = re.findall(r"^```sh\n(.*?)^```$", stretch, flags=re.S | re.M)
    assert blocks, f"docs/{doc}: no sh blocks between the e2e markers"
    return blocks


def run_as_reader(cluster: Cluster, blocks: list[str], helm: Path) -> str:
    """Run the blocks as the doc's reader does; their stdout (the test fails with their stderr)."""
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {**cluster.env, "PATH": f"{helm.parent}:{cluster.env['PATH']}"}
    env["HELM_CACHE_HOME"] = str(cluster.state_dir / "helm-cache")
    result = subprocess.run(
        ["ip", "netns", "exec", cluster.netns, "bash", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (
        f"the documented commands failed ({result.returncode}):\n{script}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result.stdout


def responses(output: str) -> list[tuple[dict[str, str], dict[str, object]]]:
    """(headers, JSON body) of every `curl -s -D-` answer in the output, in order."""
    answers = []
    for chunk in re.split(r"(?=HTTP/1\.1 \d{3} )", output)[1:]:
        head, _, body = chunk.replace("\r\n", "\n").partition("\n\n")
        lines = head.splitlines()
        assert lines[0].startswith("HTTP/1.1 200"), chunk[:2000]
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        answers.append((headers, json.JSONDecoder().raw_decode(body.strip())[0]))
    return answers


def _delete_crds(cluster: Cluster) -> None:
    """No kvgate CRDs (and so no pools or policies): custom resources first, finalizers dropped."""
    for crd in CRDS:
        found = cluster.kubectl("get", crd, "-A", "-o", "json", check=False)
        if found.returncode != 0:
            continue
        for item in json.loads(found.stdout)["items"]:
            meta = item["metadata"]
            cluster.kubectl("patch", crd, meta["name"], "-n", meta["namespace"], "--type=merge",
                            "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
    cluster.kubectl("delete", "crd", *CRDS, "--ignore-not-found", "--wait", timeout=120)


def _uninstall(cluster: Cluster, helm: Path) -> None:
    cluster.kubectl("delete", "routingpolicies,inferencepools", "--all", "-n", "default",
                    "--cascade=foreground", "--wait", "--timeout=120s", timeout=150, check=False)  # fmt: skip
    cluster.kubectl("delete", "secret", "kvgate-redis", "-n", "default", "--ignore-not-found")
    subprocess.run([str(helm), "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait",
                    "--timeout", "120s"], env=cluster.env, capture_output=True, timeout=180)  # fmt: skip
    cluster.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--ignore-not-found", "--wait",
                    "--timeout=120s", timeout=150)  # fmt: skip


@pytest.fixture
def new_cluster(cluster: Cluster) -> Iterator[Path]:
    """The cluster as a newcomer finds it (no kvgate), restored afterwards; yields helm's path."""
    if cluster.external:
        pytest.skip("the docs' commands run in the playground's network namespace")
    helm = helm_binary()
    _uninstall(cluster, helm)
    _delete_crds(cluster)
    yield helm
    _uninstall(cluster, helm)


def test_the_playground_commands_give_a_prefix_hit(cluster: Cluster, new_cluster: Path) -> None:
    output = run_as_reader(cluster, documented_commands("playground.md"), new_cluster)
    (first_headers, _), (second_headers, second) = responses(output)
    assert first_headers["x-kvgate-decision"] == "no-hit-spread"
    assert second_headers["x-kvgate-decision"] == "prefix-hit"
    assert second_headers["x-kvgate-endpoint"] == first_headers["x-kvgate-endpoint"]
    assert int(second_headers["x-kvgate-prefix-hit-tokens"]) > 0
    usage = second["usage"]
    assert isinstance(usage, dict) and usage["prompt_tokens_details"]["cached_tokens"] >= 64
    assert re.search(
        r"^routingpolicy\.kvgate\.io/sim +sim +3 +1 +True +False +RouterReady", output, re.M
    )


def test_the_install_example_set_serves_a_request(cluster: Cluster, new_cluster: Path) -> None:
    output = run_as_reader(cluster, documented_commands("install.md"), new_cluster)
    ((headers, body),) = responses(output)
    assert headers["x-kvgate-pool"] == "default/sim"
    assert body["choices"]
    policy = cluster.get("routingpolicy", "sim", "-n", "default")
    assert policy["status"]["reason"] == "RouterReady" and policy["status"]["readyReplicas"] == 1
