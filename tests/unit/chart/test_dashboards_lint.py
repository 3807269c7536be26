"""The dashboards' JSON: structure Grafana needs and the filters every query must apply."""

from __future__ import annotations

import re

import pytest
from dashboard_queries import TEMPLATE_VARIABLES, load, names, panel_queries, variable_queries


@pytest.mark.parametrize("name", names())
def test_dashboard_structure(name: str) -> None:
    board = load(name)
    assert board["uid"] == f"kvgate-{name}" and board["title"].startswith("kvgate / ")
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", *TEMPLATE_VARIABLES]
    for var in board["templating"]["list"][1:]:
        assert var["includeAll"] and var["allValue"] == ".*" and var["multi"]
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["description"], panel["title"]
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24


# Series one per router process, of no pool: the response counter (a response may be the
# router's own, of no pool) and the directory's degraded gauge.
PER_PROCESS = {"kvgate_router_responses_total", "kvgate_directory_fallback_degraded"}


@pytest.mark.parametrize("query", panel_queries(), ids=lambda q: q.name)
def test_every_selector_is_filtered_by_namespace_and_pool(query) -> None:  # type: ignore[no-untyped-def]
    selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", query.expr)
    assert selectors, query.expr
    for metric, labels in selectors:
        assert 'namespace=~"$namespace"' in labels, (metric, query.expr)
        if metric in PER_PROCESS:  # no pool label
            assert 'policy=~"$policy"' in labels, metric
        elif metric.startswith("kvgate_router_"):
            assert 'policy=~"$policy"' in labels and 'pool=~"$pool"' in labels, metric
        elif metric.startswith(("vllm:", "kvgate_directory_")):
            assert 'pool=~"$pool"' in labels, metric


def test_variables_are_label_values_of_router_series() -> None:
    for name in names():
        assert set(variable_queries(name)) == set(TEMPLATE_VARIABLES)
