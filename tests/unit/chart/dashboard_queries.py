"""The PromQL of charts/kvgate/dashboards/*.json: every panel target and template variable.

Shared by the dashboard lint (tests/unit/chart) and the real-Prometheus test
(tests/integration/dashboards), which runs each expression with Grafana's variables substituted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "charts" / "kvgate" / "dashboards"
TEMPLATE_VARIABLES = ("namespace", "policy", "pool")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([A-Za-z_][A-Za-z0-9_]*)\)$")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def names() -> list[str]:
    return sorted(p.stem for p in DASHBOARDS.glob("*.json"))


def panel_queries() -> list[PanelQuery]:
    out = []
    for name in names():
        for panel in load(name)["panels"]:
            for target in panel.get("targets", []):
                out.append(PanelQuery(name, panel["title"], target["refId"], target["expr"]))
    return out


def variable_queries(name: str) -> dict[str, tuple[str, str]]:
    """Query variable -> (series selector, label) of its `label_values(selector, label)`."""
    out = {}
    for var in load(name)["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(query)
        assert match, f"{name}: variable {var['name']} is not label_values(...): {query}"
        out[var["name"]] = (match.group(1) or "", match.group(2))
    return out


def substitute(expr: str, rate_interval: str, range_: str, value: str = ".*") -> str:
    """What Grafana sends with every variable set to All (regex `value`)."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    for var in TEMPLATE_VARIABLES:
        expr = expr.replace(f"${{{var}}}", value).replace(f"${var}", value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr
