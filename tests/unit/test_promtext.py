"""kvgate.promtext against prometheus_client's own parser (the reference) and hand-made edges."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.promtext import Sample, parse_samples, sum_samples

SIM_PAGE = (Path(__file__).parents[1] / "data" / "promtext" / "sim-metrics.txt").read_text()

EDGES = "\n".join(
    [
        '# HELP vllm:num_requests_running Requests {running} with a "quote"',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="a b",engine="0"} 2',
        'vllm:num_requests_running{model_name="br{a}ces} 9",engine="1"} 3.5 1712345678901',
        'vllm:num_requests_running{model_name="q\\"uote\\\\d\\nnl",engine="2",} 1e1',
        'vllm:num_requests_running{model_name="x # not a comment"} +Inf',
        "vllm:num_requests_running_other 100",
        "vllm:num_requests_waiting 4",
        "vllm:num_requests_waiting{} 1",
        'vllm:num_requests_waiting{a="\u2028line separator"} 0.5\r',
        "vllm:kv_cache_usage_perc NaN",
        'vllm:kv_cache_usage_perc{engine="1"} 0.25',
        "  # an indented comment",
        "",
        'vllm:num_requests_waiting{broken="} 7',  # malformed: skipped
        "vllm:num_requests_waiting not-a-number",  # malformed: skipped
        "vllm:num_requests_waiting 1 2 3",  # malformed: skipped
    ]
)


def _reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _ours(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for s in parse_samples(text)]


def _same(a: list[tuple[str, dict[str, str], float]], b: list[tuple[str, dict[str, str], float]]):
    assert [(n, lab) for n, lab, _v in a] == [(n, lab) for n, lab, _v in b]
    for (_n, _l, x), (_m, _k, y) in zip(a, b, strict=True):
        assert x == y or (math.isnan(x) and math.isnan(y))


def test_a_simulator_page_parses_as_prometheus_client_parses_it() -> None:
    _same(_ours(SIM_PAGE), _reference(SIM_PAGE))
    assert len(_ours(SIM_PAGE)) > 100


def test_edge_cases_parse_as_prometheus_client_parses_them() -> None:
    well_formed = "\n".join(EDGES.split("\n")[:-3])  # the reference raises on malformed lines
    _same(_ours(well_formed), _reference(well_formed))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('m{a="b c"} 1', Sample("m", {"a": "b c"}, 1.0)),
        ('m{a="}{"} 2 17', Sample("m", {"a": "}{"}, 2.0, 17)),
        ('m{a="\\"q\\"",b="\\\\",c="\\n"} 3', Sample("m", {"a": '"q"', "b": "\\", "c": "\n"}, 3.0)),
        ('m{ a = "x" , } -Inf', Sample("m", {"a": "x"}, -math.inf)),
        ('m {a="x"} 4', Sample("m", {"a": "x"}, 4.0)),
        ("m:sub_total 5", Sample("m:sub_total", {}, 5.0)),
        ("m\t6", Sample("m", {}, 6.0)),
        ("# TYPE m counter", None),
        ("m", None),
        ("m{a=x} 1", None),
        ('m{a="x"', None),
        ("m 1 notatimestamp", None),
        ("m- 1", None),
        ("9m 1", None),
    ],
)
def test_one_line(line: str, expected: Sample | None) -> None:
    assert list(parse_samples(line)) == ([] if expected is None else [expected])


def test_sums_skip_nan_comments_longer_names_and_malformed_lines() -> None:
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    sums = sum_samples(EDGES, [*names, "vllm:absent"])
    assert sums == {
        "vllm:num_requests_running": math.inf,  # 2 + 3.5 + 10 + inf
        "vllm:num_requests_waiting": 5.5,
        "vllm:kv_cache_usage_perc": 0.25,
    }
    assert sum_samples(EDGES, names, where={"engine": "1"}) == {
        "vllm:num_requests_running": 3.5,
        "vllm:kv_cache_usage_perc": 0.25,
    }
    assert sum_samples(EDGES, []) == {}


def test_fast_sums_equal_full_parse_sums_on_random_pages() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lines = []
        for _ in range(rng.randrange(1, 30)):
            name = rng.choice(["a", "a_b", "ab", "b"])
            labels = ",".join(
                f'{k}="{rng.choice(["x", "}", "{", " ", "#", chr(92) * 2, chr(92) + chr(34)])}"'
                for k in rng.sample(["k", "l", "m"], rng.randrange(0, 3))
            )
            label_set = f"{{{labels}}}" if labels or rng.random() < 0.3 else ""
            value = rng.choice(["1", "2.5", "-3", "NaN", "1e2"])
            stamp = f" {rng.randrange(10**12)}" if rng.random() < 0.3 else ""
            lines.append(f"{name}{label_set} {value}{stamp}")
        text = "\n".join(lines)
        full: dict[str, float] = {}
        for s in parse_samples(text):
            if s.name in ("a", "ab") and not math.isnan(s.value):
                full[s.name] = full.get(s.name, 0.0) + s.value
        assert sum_samples(text, ("a", "ab")) == full, text
