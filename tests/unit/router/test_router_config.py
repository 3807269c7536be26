import pytest
from pydantic import ValidationError

from kvgate.api.router_config import (
    KvEventsConfig,
    RouterConfig,
    SecretRef,
    StaticEndpoint,
    parse_router_config,
)

MINIMAL = """
pools:
  - name: llama
    model: meta-llama/Llama-3.1-8B-Instruct
    endpoints:
      static:
        - url: http://127.0.0.1:8001/
          kv_events: tcp://127.0.0.1:5557
"""


def test_minimal_config_gets_documented_defaults():
    cfg = parse_router_config(MINIMAL)
    pool = cfg.pools[0]
    assert pool.key == "default/llama"
    assert pool.engine.block_size == 16
    assert pool.engine.hash_algo == "sha256"
    assert pool.pool_class == "online"
    assert cfg.policy.name == "kvgate"
    assert cfg.directory.backend == "memory"
    assert cfg.load_metrics.scrape_interval_seconds == 0.1
    ep = pool.endpoints.static[0]
    assert ep.url == "http://127.0.0.1:8001"
    assert ep.endpoint_id == "127.0.0.1:8001"


def test_a_pods_kv_event_queue_is_bounded_in_bytes():
    """ZMQ counts its receive queue in messages: 1,000 of up to 8 MiB held 8 GiB a pod."""
    default = KvEventsConfig()
    held = default.receive_queue_messages * default.max_message_bytes
    assert held <= default.receive_queue_bytes == 1024 * 1024 * 1024
    assert default.receive_queue_messages == 128  # a directory call's timeout of engine steps
    small = KvEventsConfig(max_message_bytes=1024 * 1024, receive_queue_bytes=64 * 1024 * 1024)
    assert small.receive_queue_messages == 64
    assert KvEventsConfig(receive_queue_bytes=1024).receive_queue_messages == 1  # never 0


def test_unknown_keys_are_rejected():
    with pytest.raises(ValidationError):
        parse_router_config(MINIMAL + "polcy: {name: prefix}\n")


def test_endpoints_need_exactly_one_source():
    with pytest.raises(ValidationError):
        RouterConfig.model_validate({"pools": [{"name": "a", "model": "m", "endpoints": {}}]})
    with pytest.raises(ValidationError):
        RouterConfig.model_validate(
            {
                "pools": [
                    {
                        "name": "a",
                        "model": "m",
                        "endpoints": {
                            "static": [{"url": "http://x:1"}],
                            "kubernetes": {"service": "b"},
                        },
                    }
                ]
            }
        )


def test_bad_urls_are_rejected():
    with pytest.raises(ValidationError):
        StaticEndpoint(url="127.0.0.1:8000")
    with pytest.raises(ValidationError):
        StaticEndpoint(url="http://127.0.0.1:8000", kv_events="127.0.0.1:5557")


def test_duplicate_pools_are_rejected():
    pool = {"name": "a", "model": "m", "endpoints": {"static": [{"url": "http://x:1"}]}}
    with pytest.raises(ValidationError):
        RouterConfig.model_validate({"pools": [pool, pool]})


def test_secret_ref_reads_value_file_and_env(tmp_path, monkeypatch):
    path = tmp_path / "key"
    path.write_text("from-file\n")
    monkeypatch.setenv("KVGATE_TEST_SECRET", "from-env")
    assert SecretRef(value="inline").read() == "inline"
    assert SecretRef(file=str(path)).read() == "from-file"
    assert SecretRef(env="KVGATE_TEST_SECRET").read() == "from-env"
    with pytest.raises(ValidationError):
        SecretRef(value="a", env="B")
    with pytest.raises(ValueError):
        SecretRef(file=str(tmp_path / "missing")).read()


def test_non_mapping_is_rejected():
    with pytest.raises(ValueError):
        parse_router_config("- a\n- b\n")


def test_documented_examples_are_valid_configs():
    import re
    from pathlib import Path

    from kvgate.scoring.registry import build_policy

    doc = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        cfg = parse_router_config(block)
        policy = cfg.policy  # its params are checked against kvgate.scoring's registry
        build_policy(policy.name, policy.params, max_affinity_wait_seconds=1.0)


def test_edge_limits_have_documented_defaults_and_the_pod_outlives_the_grace():
    from kvgate.operator.render.router import ROUTER_TERMINATION_GRACE_SECONDS
    from kvgate.serving import _BACKSTOP_SECONDS

    cfg = parse_router_config(MINIMAL)
    server, limits = cfg.server, cfg.limits
    assert (server.max_header_bytes, server.max_connections) == (65536, 2048)
    assert (server.header_timeout_seconds, server.body_timeout_seconds) == (10.0, 60.0)
    assert (server.idle_timeout_seconds, server.shutdown_grace_seconds) == (15.0, 30.0)
    assert limits.max_json_depth == 64
    # The kubelet's SIGKILL must come after the drain, its backstop and the exit.
    assert server.shutdown_grace_seconds + _BACKSTOP_SECONDS + 5 <= ROUTER_TERMINATION_GRACE_SECONDS
    with pytest.raises(ValidationError):
        parse_router_config(MINIMAL + "limits: {max_json_depth: 1000}\n")
    with pytest.raises(ValidationError):
        parse_router_config(MINIMAL + "server: {max_header_bytes: 10}\n")
