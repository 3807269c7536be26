"""What `helm template charts/kvgate` renders: each behaviour a user of the chart relies on."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    CHART,
    ROOT,
    SERVICE_MONITOR_API,
    find,
    helm,
    one,
    render,
    template_text,
)

from kvgate.api.router_config import parse_router_config

INDEXER = {"enabled": True, "pools": [{"name": "sim", "namespace": "apps", "model": "sim-model"}]}


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def test_lint_is_clean_for_default_and_full_values() -> None:
    helm("lint", "--strict", str(CHART))
    values = ["indexer.enabled=true", "indexer.pools[0].name=a", "indexer.pools[0].model=m",
              "serviceMonitor.enabled=true", "redis.persistence.enabled=true"]  # fmt: skip
    helm("lint", "--strict", str(CHART), *[x for v in values for x in ("--set", v)])


def test_crds_are_the_generated_ones_and_kept_on_uninstall() -> None:
    rendered = {d["metadata"]["name"]: d for d in find(render(), "CustomResourceDefinition")}
    generated = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    assert sorted(rendered) == sorted(g["metadata"]["name"] for g in generated)
    for crd in generated:
        chart_crd = rendered[crd["metadata"]["name"]]
        assert chart_crd["spec"] == crd["spec"]
        assert chart_crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"].items() <= chart_crd["metadata"]["labels"].items()


def test_crds_off_or_not_kept() -> None:
    assert not find(render({"crds": {"enabled": False}}), "CustomResourceDefinition")
    for crd in find(render({"crds": {"keep": False}}), "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_operator_rbac_is_the_canonical_least_privilege_role() -> None:
    canonical = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "rbac" / "operator.yaml").read_text())
        if d and d["kind"] == "ClusterRole"
    )
    docs = render()
    role = one(docs, "ClusterRole", "kvgate-operator")
    assert role["rules"] == canonical["rules"]
    binding = one(docs, "ClusterRoleBinding", "kvgate-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kvgate-operator", "namespace": "kvgate-system"}
    ]
    deployment = one(docs, "Deployment", "kvgate-operator")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "kvgate-operator"
    assert not find(render({"operator": {"rbac": {"create": False}}}), "ClusterRole")


def test_operator_command_watches_namespaces_and_uses_the_router_image() -> None:
    args = one(render(), "Deployment", "kvgate-operator")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert args[:3] == ["--log-level", "INFO", "operator"]
    assert "--all-namespaces" in args and "--standalone" in args
    assert args[args.index("--router-image") + 1] == "ghcr.io/kvgate/kvgate:0.1.0"
    values = {"operator": {"watchNamespaces": ["a", "b"]}, "image": {"tag": "9.9"}}
    container = one(render(values), "Deployment", "kvgate-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == "ghcr.io/kvgate/kvgate:9.9"
    assert "--all-namespaces" not in container["args"]
    assert " ".join(container["args"]).count("--namespace") == 2


@pytest.mark.parametrize(
    "values", [{}, {"indexer": INDEXER, "redis": {"persistence": {"enabled": True}}}]
)
def test_every_pod_runs_hardened_with_resources(values: dict[str, Any]) -> None:
    docs = workloads(render(values))
    assert len(docs) == (3 if values else 2)
    for workload in docs:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"] and container["resources"]["limits"]


def test_scheduling_values_reach_the_pods() -> None:
    placement = {
        "nodeSelector": {"pool": "infra"},
        "tolerations": [{"key": "infra", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
    }
    values = {"operator": placement, "redis": placement, "indexer": {**INDEXER, **placement}}
    docs = workloads(render(values))
    assert len(docs) == 3
    for workload in docs:
        pod = workload["spec"]["template"]["spec"]
        assert {k: pod[k] for k in placement} == placement


def test_bundled_redis_uses_a_generated_password_from_a_secret() -> None:
    docs = render()
    secret = one(docs, "Secret", "kvgate-redis")
    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    again = [d for d in yaml.safe_load_all(template_text().stdout) if d]
    other = base64.b64decode(one(again, "Secret", "kvgate-redis")["data"]["redis-password"])
    assert other.decode() != password  # random on install (kept on upgrade through lookup)
    container = one(docs, "StatefulSet", "kvgate-redis")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["args"][container["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "kvgate-redis",
        "key": "redis-password",
    }
    assert one(docs, "Service", "kvgate-redis")["spec"]["ports"][0]["port"] == 6379


def test_existing_secret_is_used_and_none_is_created() -> None:
    docs = render({"redis": {"auth": {"existingSecret": "mine", "secretKey": "pw"}}})
    assert not find(docs, "Secret")
    env = one(docs, "StatefulSet", "kvgate-redis")["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    assert env[0]["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "pw"}


def redis_password_ref(docs: list[dict[str, Any]]) -> Any:
    container = one(docs, "Deployment", "kvgate-indexer")["spec"]["template"]["spec"]["containers"][
        0
    ]
    (env,) = [e for e in container.get("env", []) if e["name"] == "REDIS_PASSWORD"]
    return env["valueFrom"]["secretKeyRef"]


def indexer_config(docs: list[dict[str, Any]]) -> Any:
    return parse_router_config(one(docs, "ConfigMap", "kvgate-indexer")["data"]["indexer.yaml"])


def test_indexer_config_is_a_valid_router_config_on_the_bundled_redis() -> None:
    docs = render({"indexer": INDEXER})
    config = indexer_config(docs)
    assert config.directory.backend == "redis"
    assert config.directory.redis.url == "redis://kvgate-redis.kvgate-system.svc:6379/0"
    assert config.directory.redis.password is not None
    assert config.directory.redis.password.env == "REDIS_PASSWORD"
    (pool,) = config.pools
    assert pool.key == "apps/sim"
    assert pool.endpoints.kubernetes is not None
    # The indexer reads the EndpointSlices of the Service the operator renders for the pool.
    assert pool.endpoints.kubernetes.service == "sim"
    role = one(docs, "Role", "kvgate-indexer")
    assert role["metadata"]["namespace"] == "apps"
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    container = one(docs, "Deployment", "kvgate-indexer")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert {"name": "config", "mountPath": "/etc/kvgate", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert redis_password_ref(docs) == {"name": "kvgate-redis", "key": "redis-password"}


def test_external_redis_replaces_the_bundled_one() -> None:
    values = {
        "redis": {"enabled": False, "external": {"url": "redis://r:6379/1", "existingSecret": "s"}},
        "indexer": INDEXER,
    }
    docs = render(values)
    assert not find(docs, "StatefulSet") and not find(docs, "Secret")
    config = indexer_config(docs)
    assert config.directory.redis.url == "redis://r:6379/1"
    assert redis_password_ref(docs) == {"name": "s", "key": "redis-password"}
    no_password = render({"redis": {"enabled": False, "external": {"url": "redis://r:6379"}},
                          "indexer": INDEXER})  # fmt: skip
    assert indexer_config(no_password).directory.redis.password is None
    no_env = one(no_password, "Deployment", "kvgate-indexer")["spec"]["template"]["spec"]
    assert "env" not in no_env["containers"][0]


@pytest.mark.parametrize(
    ("tls", "volume"),
    [
        ({"caConfigMap": "redis-ca"}, {"configMap": {"name": "redis-ca"}}),
        ({"caSecret": "redis-tls", "caKey": "ca.pem"}, {"secret": {"secretName": "redis-tls"}}),
    ],
)
def test_managed_redis_cluster_with_url_secret_and_tls(
    tls: dict[str, str], volume: dict[str, Any]
) -> None:
    external = {"urlSecret": "managed", "cluster": True, "tls": tls}
    docs = render({"redis": {"enabled": False, "external": external}, "indexer": INDEXER})
    redis = indexer_config(docs).directory.redis
    assert redis.cluster and redis.url_secret is not None and redis.url_secret.env == "REDIS_URL"
    key = tls.get("caKey", "ca.crt")
    assert redis.ca_bundle is not None and redis.ca_bundle.file == f"/var/lib/kvgate/redis-ca/{key}"
    pod = one(docs, "Deployment", "kvgate-indexer")["spec"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]}
    assert env == {"REDIS_URL": {"name": "managed", "key": "redis-url"}}
    assert {"name": "redis-ca", **volume} in pod["volumes"]
    mount = {"name": "redis-ca", "mountPath": "/var/lib/kvgate/redis-ca", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"]


def test_service_monitors_need_both_the_value_and_the_crd() -> None:
    assert not find(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    assert not find(render({}, [SERVICE_MONITOR_API]), "ServiceMonitor")
    docs = render({"serviceMonitor": {"enabled": True}}, [SERVICE_MONITOR_API])
    routers = one(docs, "ServiceMonitor", "kvgate-routers")
    assert routers["spec"]["selector"]["matchExpressions"][0]["values"] == ["router", "indexer"]
    engines = one(docs, "ServiceMonitor", "kvgate-engines")
    relabel = engines["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "pool" and relabel["separator"] == "/"
    # The engines of a Gateway API InferencePool too, behind the Service the operator renders
    # for them (their vLLM metrics were never scraped), with the same `pool` label.
    from kvgate.operator.render.gateway import GATEWAY_COMPONENT, GATEWAY_POOL_LABEL

    components = engines["spec"]["selector"]["matchExpressions"][0]["values"]
    assert components == ["engine", GATEWAY_COMPONENT]
    gateway_label = "__meta_kubernetes_service_label_" + GATEWAY_POOL_LABEL.replace(
        ".", "_"
    ).replace("/", "_").replace("-", "_")
    sources = [r["sourceLabels"][-1] for r in engines["spec"]["endpoints"][0]["relabelings"]]
    assert gateway_label in sources
    only_routers = render(
        {"serviceMonitor": {"enabled": True, "engines": False}}, [SERVICE_MONITOR_API]
    )
    assert len(find(only_routers, "ServiceMonitor")) == 1


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert {f.stem for f in files} == {"overview", "directory", "sessions"}
    docs = find(render(), "ConfigMap")
    maps = {d["metadata"]["name"]: d for d in docs if "dashboard" in d["metadata"]["name"]}
    assert len(maps) == len(files)
    for path in files:
        cm = maps[f"kvgate-dashboard-{path.stem}"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"][f"kvgate-{path.stem}.json"]) == json.loads(path.read_text())
    custom = {"dashboards": {"label": "dash", "labelValue": "yes", "namespace": "monitoring"}}
    for cm in find(render(custom), "ConfigMap"):
        if "dashboard" in cm["metadata"]["name"]:
            assert cm["metadata"]["labels"]["dash"] == "yes"
            assert cm["metadata"]["namespace"] == "monitoring"
    off = find(render({"dashboards": {"enabled": False}}), "ConfigMap")
    assert not [d for d in off if "dashboard" in d["metadata"]["name"]]


def test_every_object_carries_the_recommended_labels() -> None:
    for doc in render({"indexer": INDEXER}):
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kvgate"
        assert labels["app.kubernetes.io/managed-by"] == "kvgate"
        assert labels["app.kubernetes.io/instance"] == "kvgate"
        assert labels["app.kubernetes.io/component"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 2}}, "additional properties 'replicas' not allowed"),
        ({"redis": {"enabled": False}}, "/redis/external/url"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"indexer": {"enabled": True}}, "indexer.enabled needs at least one item"),
        ({"indexer": {"enabled": True, "pools": [{"name": "a"}]}}, "missing property 'model'"),
    ],
)
def test_bad_values_are_rejected(values: dict[str, Any], message: str) -> None:
    result = template_text(values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def _values_keys() -> tuple[list[tuple[str, bool]], set[str]]:
    """(dotted key, documented) for every key of values.yaml whose parent is not documented.

    A value is documented by a comment block starting with `# --` right above it; a key without
    one is a section, and each of its keys must be documented in turn.
    """
    lines = (CHART / "values.yaml").read_text().splitlines()
    found: list[tuple[str, bool]] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        comments = []
        for above in reversed(lines[:i]):
            if not above.strip().startswith("#"):
                break
            comments.append(above.strip())
        documented = any(c.startswith("# --") for c in comments)  # helm-docs convention
        if not any(doc for _, _, doc in stack):  # children of a documented value are its value
            found.append((".".join([k for _, k, _ in stack] + [match.group(2)]), documented))
        stack.append((indent, match.group(2), documented))
    return found, {k for k, _ in found}


def test_every_value_is_documented_where_it_is_defined() -> None:
    found, _ = _values_keys()
    sections = {k.rsplit(".", 1)[0] for k, _ in found if "." in k}
    undocumented = [k for k, doc in found if not doc and k not in sections]
    assert not undocumented, f"values without a comment above them: {undocumented}"


def test_schema_and_values_name_the_same_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    _, keys = _values_keys()

    def walk(node: dict[str, Any], prefix: str) -> set[str]:
        out = set()
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}{key}"
            out.add(path)
            if sub.get("additionalProperties") is False:
                out |= walk(sub, path + ".")
        return out

    in_schema = walk(schema, "") - {"global"}
    assert in_schema - keys == set(), "schema keys missing from values.yaml"
    assert {k for k in keys if k.count(".") < 3} - in_schema == set(), "values not in the schema"


def test_notes_tell_the_user_what_to_apply_next() -> None:
    result = helm(
        "install", "kvgate", str(CHART), "--dry-run=client", "--namespace", "kvgate-system"
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "examples/policy-simulated.yaml" in notes and "examples/policy.yaml" in notes
    assert "redis://kvgate-redis.kvgate-system.svc:6379/0" in notes
    assert "password: {name: kvgate-redis, key: redis-password}" in notes


def test_the_repository_paths_link_into_the_chart() -> None:
    """The chart holds the real files (helm warns about links inside a chart, not outside it)."""
    assert (ROOT / "crds").resolve() == CHART / "files" / "crds"
    assert (ROOT / "deploy" / "rbac").resolve() == CHART / "files" / "rbac"
    assert not (CHART / "files" / "crds").is_symlink()
    assert not (CHART / "files" / "rbac").is_symlink()


def test_helm_prints_nothing_but_the_manifests() -> None:
    result = helm("template", "kvgate", str(CHART), "--namespace", "kvgate-system")
    assert result.stderr == ""


def test_install_docs_list_every_value() -> None:
    found, _ = _values_keys()
    reference = (ROOT / "docs" / "install.md").read_text().split("## Values reference", 1)[1]
    missing = [key for key, documented in found if documented and f"| `{key}` |" not in reference]
    assert not missing, f"docs/install.md's values reference lacks {missing}"


def test_packaged_chart_carries_the_linked_files(tmp_path: Path) -> None:
    """`helm package` carries files/crds and files/rbac: the published chart needs no repo."""
    helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("kvgate-*.tgz")
    packaged = helm("template", "kvgate", str(package), "--namespace", "kvgate-system").stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(packaged) if d]
    assert kinds.count("CustomResourceDefinition") == 2 and "ClusterRole" in kinds
