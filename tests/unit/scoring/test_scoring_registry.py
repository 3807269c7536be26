"""The plugin registry: names, typed params, loud failures; building policies from config."""

from __future__ import annotations

import random

import pydantic
import pytest
from scoring_helpers import fleet, request

from kvgate.scoring.base import ChoiceHistory
from kvgate.scoring.params import NoParams
from kvgate.scoring.plugins.healthy import HealthyFilter
from kvgate.scoring.policies import KvgateParams
from kvgate.scoring.registry import PluginRegistry, RegistryError, build_policy, default_registry


def test_builtins_are_registered_by_kebab_name() -> None:
    reg = default_registry()
    assert reg.names("filter") == [
        "affinity-cap",
        "class-isolation",
        "healthy",
        "holder-load",
        "load-bound",
        "load-imbalance",
        "load-stddev",
        "prefix-cache-affinity",
    ]
    assert reg.names("scorer") == [
        "gie-prefix-cache",
        "kv-block-cost",
        "kv-cache-usage",
        "match-minus-load",
        "match-percent",
        "predicted-ttft",
        "prefix-cache",
        "queue-depth",
        "token-load",
        "waiting-queue",
    ]
    assert reg.names("picker") == ["near-equal", "round-robin", "softmax"]
    assert reg.names("policy") == [
        "aibrix-prefix",
        "dynamo-kv",
        "gie-weighted",
        "kvgate",
        "least-load",
        "llm-d-sticky",
        "load-aware",
        "pipeline",
        "prefix",
        "round-robin",
    ]
    assert all(reg.summaries("policy").values())


def test_duplicate_registration_fails() -> None:
    reg = default_registry()
    with pytest.raises(RegistryError, match="already registered"):
        reg.add_filter("healthy", NoParams, HealthyFilter, "again")


def test_non_kebab_names_are_refused() -> None:
    reg = PluginRegistry()
    for bad in ["Healthy", "my_filter", "-x", "a--b", ""]:
        with pytest.raises(RegistryError, match="kebab"):
            reg.add_filter(bad, NoParams, HealthyFilter, "")


def test_unknown_name_lists_the_known_ones() -> None:
    reg = default_registry()
    with pytest.raises(RegistryError, match=r"unknown scorer 'prefix'.*prefix-cache"):
        reg.scorer("prefix")
    with pytest.raises(RegistryError, match="unknown policy"):
        build_policy("nope")


def test_params_are_typed_and_typos_fail() -> None:
    reg = default_registry()
    with pytest.raises(pydantic.ValidationError):
        reg.filter("load-bound", {"factr": 2})
    with pytest.raises(pydantic.ValidationError):
        reg.filter("load-bound", {"factor": 0.5})
    with pytest.raises(pydantic.ValidationError):
        build_policy("kvgate", {"cost_model": {"prior_prefill_tokens_per_second": -1}})
    with pytest.raises(pydantic.ValidationError):
        build_policy("round-robin", {"tolerance": 0.1})


def test_documented_defaults() -> None:
    p = KvgateParams()
    assert p.max_affinity_wait_seconds == 5.0
    assert p.load_bound is None  # the bounded-load guard is opt-in
    assert p.tolerance == 0.1
    assert p.cost_model.prior_prefill_tokens_per_second == 10_000.0


def test_top_level_affinity_cap_goes_to_policies_that_have_it() -> None:
    kv = build_policy("kvgate", {}, max_affinity_wait_seconds=0.5)
    caps = [f for f in kv.filters if f.name == "affinity-cap"]  # type: ignore[attr-defined]
    assert caps[0].params.max_affinity_wait_seconds == 0.5
    explicit = build_policy("kvgate", {"max_affinity_wait_seconds": 7}, max_affinity_wait_seconds=1)
    caps = [f for f in explicit.filters if f.name == "affinity-cap"]  # type: ignore[attr-defined]
    assert caps[0].params.max_affinity_wait_seconds == 7
    build_policy("round-robin", {}, max_affinity_wait_seconds=0.5)  # ignored, no error


def test_pipeline_policy_assembled_from_names() -> None:
    policy = build_policy(
        "pipeline",
        {
            "filters": [{"name": "healthy"}, {"name": "load-bound", "params": {"factor": 2}}],
            "scorers": [
                {"name": "queue-depth", "weight": 2},
                {"name": "kv-cache-usage", "weight": 2},
                {"name": "prefix-cache", "weight": 3},
            ],
            "picker": {"name": "near-equal", "params": {"tolerance": 0.05}},
        },
    )
    d = policy.decide(
        request(1600),
        fleet(3),
        {"pod-2": 90},
        now=0.0,
        rng=random.Random(0),
        history=ChoiceHistory(),
    )
    assert d.endpoint_id == "pod-2"
    assert d.reason == "prefix-hit"
    assert d.policy == "pipeline"
    with pytest.raises(RegistryError):
        build_policy("pipeline", {"scorers": [{"name": "nope"}]})
