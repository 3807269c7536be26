"""Engine rendering details the router, the simulator and the scheduler rely on."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from kvgate.api.pool import InferencePoolSpec
from kvgate.operator.render import Owner, pool_children
from kvgate.operator.render.common import dns_label
from kvgate.operator.render.engine import engine_args, engine_resources, kv_events_config

OWNER = Owner(kind="InferencePool", name="llama", namespace="ai", uid="u1")


def spec(**fields: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate({"model": "org/model", **fields})


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_args_enable_prefix_caching_and_kv_events() -> None:
    args = engine_args(spec(servedModelName="m", cache={"hashAlgo": "sha256_cbor"}))
    assert flag(args, "--model") == "org/model"
    assert flag(args, "--served-model-name") == "m"
    assert flag(args, "--port") == "8000"
    assert flag(args, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args
    events = json.loads(flag(args, "--kv-events-config"))
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
        "topic": "kv@$(POD_IP)@m",
    }


def test_optional_flags_only_when_set_and_extra_args_last() -> None:
    args = engine_args(spec(engine={"extraArgs": ["--enforce-eager"]}))
    assert "--max-model-len" not in args and "--max-num-seqs" not in args
    assert args[-1] == "--enforce-eager"
    args = engine_args(spec(engine={"maxModelLen": 4096, "maxNumSeqs": 8}))
    assert (flag(args, "--max-model-len"), flag(args, "--max-num-seqs")) == ("4096", "8")


def test_gpus_become_the_nvidia_limit_unless_given() -> None:
    assert engine_resources(spec()) == {"limits": {"nvidia.com/gpu": 1}}
    assert engine_resources(spec(gpus=0)) == {}
    explicit = spec(gpus=4, resources={"limits": {"nvidia.com/gpu": 8}})
    assert engine_resources(explicit) == {"limits": {"nvidia.com/gpu": 8}}
    both = spec(gpus=2, resources={"requests": {"nvidia.com/gpu": 1, "cpu": "4"}})
    assert engine_resources(both) == {
        "requests": {"nvidia.com/gpu": 2, "cpu": "4"},
        "limits": {"nvidia.com/gpu": 2},
    }


def test_pod_env_ports_and_probes() -> None:
    deployment = pool_children(OWNER, spec(cache={"hashSeed": 1234}))[2]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["PYTHONHASHSEED"]["value"] == "1234"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # $(POD_IP) in the args is only expanded if POD_IP is defined before use: it is the first.
    assert container["env"][0]["name"] == "POD_IP"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8000,
        "kv-events": 5557,
        "kv-replay": 5558,
    }
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}


def test_selector_is_stable_and_labels_cannot_be_overridden() -> None:
    pod_labels = {"app.kubernetes.io/instance": "evil", "team": "a"}
    deployment = pool_children(OWNER, spec(pod={"labels": pod_labels}))[2]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "llama" and labels["team"] == "a"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert all(labels[k] == v for k, v in selector.items())
    # The selector must not depend on mutable spec fields (Deployment selectors are immutable).
    other = pool_children(OWNER, spec(poolClass="batch", replicas=9))[2]
    assert other["spec"]["selector"] == deployment["spec"]["selector"]


def test_kv_events_topic_uses_the_served_name() -> None:
    assert '"topic":"kv@$(POD_IP)@a/b"' in kv_events_config("a/b")


def test_dns_label_shortens_long_names() -> None:
    name = dns_label("x" * 80, "router")
    assert len(name) == 63 and name != dns_label("x" * 81, "router")
    assert dns_label("My_Policy", "router") == "my-policy-router"


def test_rendered_args_are_accepted_by_the_simulator() -> None:
    config = pytest.importorskip("kvgate.sim.config")
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_vllm_arguments(parser)
    full = spec(
        servedModelName="sim",
        cache={"hashAlgo": "sha256_cbor", "hashSeed": 5},
        engine={
            "blockSize": 32,
            "maxModelLen": 2048,
            "maxNumSeqs": 4,
            "gpuMemoryUtilization": 0.5,
            "cpuOffloadGib": 16,
        },
    )
    args = [a.replace("$(POD_IP)", "10.244.0.7") for a in engine_args(full)]
    parsed = parser.parse_args(args)
    server = config.config_from_args(parsed, environ={"PYTHONHASHSEED": "5"})
    assert server.engine.block_size == 32
    assert server.hash_algo == "sha256_cbor"
    assert server.hash_seed == "5"
    assert server.enable_prompt_tokens_details is True
    assert server.kv_events.topic == "kv@10.244.0.7@sim"
    assert server.engine.kv_offloading_size_gib == 16.0


def test_cpu_offloading_renders_vllm_flags_and_tells_the_router() -> None:
    from kvgate.operator.render.config import SelectedPool, pool_config

    offloading = spec(engine={"cpuOffloadGib": 0.5})
    args = engine_args(offloading)
    assert args[args.index("--kv-offloading-backend") + 1] == "native"
    assert args[args.index("--kv-offloading-size") + 1] == "0.5"
    assert pool_config(SelectedPool("p", "ns", offloading)).engine.cpu_offload
    plain = spec()
    assert "--kv-offloading-size" not in engine_args(plain)
    assert not pool_config(SelectedPool("p", "ns", plain)).engine.cpu_offload


def test_lora_adapters_become_vllm_flags_and_router_config() -> None:
    from kvgate.operator.render.config import SelectedPool, pool_config
    from kvgate.sim.config import add_vllm_arguments

    lora = {
        "adapters": [{"name": "sql", "path": "/adapters/sql"}, {"name": "chat", "path": "org/c"}],
        "maxLoras": 2,
        "maxLoraRank": 64,
    }
    pool = spec(lora=lora)
    args = engine_args(pool)
    assert "--enable-lora" in args
    assert flag(args, "--max-loras") == "2" and flag(args, "--max-lora-rank") == "64"
    at = args.index("--lora-modules")
    assert args[at + 1 : at + 3] == ["sql=/adapters/sql", "chat=org/c"]
    # The simulator (and vLLM) parse exactly these flags.
    parser = argparse.ArgumentParser()
    add_vllm_arguments(parser, single_pod=True)
    parsed = parser.parse_args(args)
    assert parsed.enable_lora and parsed.max_loras == 2
    assert parsed.lora_modules == [
        ("sql", "/adapters/sql"),
        ("chat", "org/c"),
    ]
    config = pool_config(SelectedPool("llama", "ai", pool))
    assert [(a.name, a.path) for a in config.lora_adapters] == [
        ("sql", "/adapters/sql"),
        ("chat", "org/c"),
    ]
    assert config.lora_for("chat") is not None and "sql" in config.model_names
    assert "--enable-lora" not in engine_args(spec())
