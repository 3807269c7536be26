"""Router rendering details: Secrets by reference, config mounted as a directory, tokenizers."""

from __future__ import annotations

from typing import Any

from kvgate.api.policy import RoutingPolicySpec
from kvgate.api.pool import InferencePoolSpec
from kvgate.api.router_config import parse_router_config
from kvgate.operator.render import Owner, SelectedPool, policy_children
from kvgate.operator.render.config import secret_env_name

OWNER = Owner(kind="RoutingPolicy", name="front", namespace="ai", uid="u2")
POOL = SelectedPool("llama", "ai", InferencePoolSpec.model_validate({"model": "m"}))


def render(indexer_replicas: int | None = None, **spec: Any) -> dict[str, Any]:
    children, _ = policy_children(
        OWNER,
        RoutingPolicySpec.model_validate({"pools": ["llama"], **spec}),
        [POOL],
        "img",
        indexer_replicas,
    )
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in children}


def test_secrets_reach_the_router_by_reference_only() -> None:
    objects = render(
        tenants={
            "items": [{"name": "a", "apiKeys": [{"name": "keys", "key": "a"}]}],
            "saltSecret": {"name": "keys", "key": "salt"},
        },
        directory={"backend": "redis", "redis": {"password": {"name": "redis", "key": "pw"}}},
        router={"adminToken": {"name": "admin", "key": "token"}},
    )
    config = parse_router_config(objects["ConfigMap/front-router-config"]["data"]["router.yaml"])
    container = objects["Deployment/front-router"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    named = [
        config.tenants.tenants[0].api_keys[0].env,
        config.tenants.salt_secret.env if config.tenants.salt_secret else None,
        config.directory.redis.password.env if config.directory.redis.password else None,
        config.admin.token.env if config.admin.token else None,
    ]
    refs = [env[str(name)]["valueFrom"]["secretKeyRef"] for name in named]
    assert refs == [
        {"name": "keys", "key": "a"},
        {"name": "keys", "key": "salt"},
        {"name": "redis", "key": "pw"},
        {"name": "admin", "key": "token"},
    ]


def test_secret_env_names_are_distinct_and_valid() -> None:
    from kvgate.api.base import SecretKeyRef

    a = secret_env_name(SecretKeyRef(name="a-b", key="c"))
    b = secret_env_name(SecretKeyRef(name="a", key="b-c"))
    assert a != b
    assert a.replace("_", "").isalnum() and a.isupper()


def test_config_is_mounted_as_a_directory_so_updates_reach_the_router() -> None:
    deployment = render()["Deployment/front-router"]
    mount = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount == {"name": "config", "mountPath": "/etc/kvgate", "readOnly": True}
    assert "subPath" not in mount


def test_router_config_changes_do_not_touch_the_pod_template() -> None:
    before = render()["Deployment/front-router"]
    after = render(scoring={"maxAffinityWaitSeconds": 0.1})["Deployment/front-router"]
    assert before == after


def test_tokenizer_config_map_is_mounted_for_the_router() -> None:
    pool = SelectedPool(
        "llama",
        "ai",
        InferencePoolSpec.model_validate(
            {"model": "m", "tokenizer": {"configMap": "tok", "chatTemplate": "t.jinja"}}
        ),
    )
    children, _ = policy_children(
        OWNER, RoutingPolicySpec.model_validate({"pools": ["llama"]}), [pool], "img"
    )
    config_map = next(c for c in children if c["kind"] == "ConfigMap")
    config = parse_router_config(config_map["data"]["router.yaml"])
    assert config.pools[0].engine.tokenizer.path == "/var/lib/kvgate/tokenizers/llama"
    assert (
        config.pools[0].engine.tokenizer.chat_template == "/var/lib/kvgate/tokenizers/llama/t.jinja"
    )
    deployment = next(c for c in children if c["kind"] == "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tokenizer-llama", "configMap": {"name": "tok"}} in volumes


def test_the_engines_chat_template_defaults_reach_the_router() -> None:
    """Set in engine.extraArgs, they changed what the engines rendered and not what the router
    keyed: every chat prompt's exact keys differed from the engines' (no hit predicted)."""
    engine = {
        "extraArgs": [
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
            '--reasoning-effort-map={"low": "minimal"}',
        ]
    }
    spec = {"model": "m", "tokenizer": {"path": "/tok"}, "engine": engine}
    pool = SelectedPool("llama", "ai", InferencePoolSpec.model_validate(spec))
    children, _ = policy_children(
        OWNER, RoutingPolicySpec.model_validate({"pools": ["llama"]}), [pool], "img"
    )
    config_map = next(c for c in children if c["kind"] == "ConfigMap")
    tokenizer = parse_router_config(config_map["data"]["router.yaml"]).pools[0].engine.tokenizer
    assert tokenizer.default_chat_template_kwargs == {"enable_thinking": False}
    assert tokenizer.reasoning_effort_map == {"low": "minimal"}


def test_redis_url_from_a_secret_and_ca_bundle_reach_router_and_indexer() -> None:
    redis = {
        "urlSecret": {"name": "managed-redis", "key": "url"},
        "cluster": True,
        "caBundle": {"configMap": "redis-ca", "key": "ca.crt"},
    }
    objects = render(1, directory={"backend": "redis", "embeddedIndexer": False, "redis": redis})
    config = parse_router_config(objects["ConfigMap/front-router-config"]["data"]["router.yaml"])
    assert config.directory.redis.cluster
    url, ca = config.directory.redis.url_secret, config.directory.redis.ca_bundle
    assert url is not None and url.env is not None and ca is not None and ca.env is not None
    for name in ("Deployment/front-router", "Deployment/front-indexer"):
        container = objects[name]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("valueFrom") for e in container["env"]}
        assert env[url.env] == {"secretKeyRef": {"name": "managed-redis", "key": "url"}}
        assert env[ca.env] == {"configMapKeyRef": {"name": "redis-ca", "key": "ca.crt"}}


def test_a_ca_bundle_in_a_secret_comes_by_secret_key_ref() -> None:
    redis = {"caBundle": {"secret": "redis-tls", "key": "ca.crt"}, "url": "rediss://r:6380/0"}
    objects = render(directory={"backend": "redis", "redis": redis})
    config = parse_router_config(objects["ConfigMap/front-router-config"]["data"]["router.yaml"])
    assert config.directory.redis.ca_bundle is not None
    container = objects["Deployment/front-router"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    ref = env[str(config.directory.redis.ca_bundle.env)]
    assert ref == {"secretKeyRef": {"name": "redis-tls", "key": "ca.crt"}}


def _router_yaml(**spec: Any) -> str:
    return str(render(**spec)["ConfigMap/front-router-config"]["data"]["router.yaml"])


def test_router_replicas_on_the_redis_directory_share_load_with_no_setting() -> None:
    shared = _router_yaml(directory={"backend": "redis"})
    assert "load_sharing" not in shared  # left to the router: on with its Redis directory
    assert parse_router_config(shared).load_sharing_enabled
    assert not parse_router_config(_router_yaml()).load_sharing_enabled  # memory directory
    off = _router_yaml(directory={"backend": "redis"}, loadSharing={"enabled": False})
    assert not parse_router_config(off).load_sharing_enabled  # an explicit false is kept


def test_router_replicas_on_the_redis_directory_share_warm_ups_with_no_setting() -> None:
    shared = parse_router_config(_router_yaml(directory={"backend": "redis"}))
    assert shared.warmup.shared is None and shared.warmup_sharing_enabled
    assert not parse_router_config(_router_yaml()).warmup_sharing_enabled  # memory directory
    off = _router_yaml(directory={"backend": "redis"}, warmup={"shared": False})
    assert not parse_router_config(off).warmup_sharing_enabled  # an explicit false is kept


def test_the_indexer_is_a_service_the_charts_service_monitor_scrapes() -> None:
    """The chart's ServiceMonitor scrapes Services of component router or indexer on a port
    named http; the indexer had no Service, so its KV-event metrics were never scraped."""
    objects = render(1, directory={"backend": "redis", "embeddedIndexer": False})
    service = objects["Service/front-indexer"]
    pods = objects["Deployment/front-indexer"]["spec"]["template"]["metadata"]["labels"]
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "indexer"
    assert service["metadata"]["labels"]["kvgate.io/policy"] == "front"
    assert service["spec"]["selector"].items() <= pods.items()
    (port,) = service["spec"]["ports"]
    container = objects["Deployment/front-indexer"]["spec"]["template"]["spec"]["containers"][0]
    assert port["name"] == "http" and port["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_indexer_rolls_when_its_pools_engines_change_and_not_otherwise() -> None:
    """It reads the config at start: a new block size never reached it (every store of the new
    engines was skipped as mismatched); a roll on every policy edit would drop the directory's
    entries, which only new events restore."""

    def annotations(pool: SelectedPool, **spec: Any) -> dict[str, str]:
        policy = RoutingPolicySpec.model_validate(
            {"pools": ["llama"], "directory": {"backend": "redis", "embeddedIndexer": False},
             **spec}
        )  # fmt: skip
        children, _ = policy_children(OWNER, policy, [pool], "img", 1)
        (indexer,) = (c for c in children if c["metadata"]["name"] == "front-indexer"
                      and c["kind"] == "Deployment")  # fmt: skip
        return dict(indexer["spec"]["template"]["metadata"]["annotations"])

    base = annotations(POOL)
    assert annotations(POOL, flowControl={"maxWaitingRequests": 3}) == base
    wider = InferencePoolSpec.model_validate({"model": "m", "engine": {"blockSize": 32}})
    assert annotations(SelectedPool("llama", "ai", wider)) != base
