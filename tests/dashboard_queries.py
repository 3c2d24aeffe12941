"""The shipped dashboard's queries, read as Grafana reads them: every panel's PromQL, the variables'
`label_values` queries, and a variable's substitution (tests/test_dashboard.py evaluates them)."""

from __future__ import annotations

import re


def panel_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """Every query of every panel: [(panel title, target refId, PromQL expression)]."""
    found = []
    for panel in dashboard["panels"]:
        for nested in [panel, *panel.get("panels", [])]:
            for target in nested.get("targets", []):
                found.append((nested["title"], target["refId"], target["expr"]))
    return found


def variable_queries(dashboard: dict) -> dict[str, str]:
    """Each query variable's `label_values(...)` query, by name."""
    return {v["name"]: v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"}


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with `$name` (and `${name}`) replaced by values[name], as Grafana interpolates a variable."""

    def value(match):
        name = match.group(1) or match.group(2)
        return values[name] if name in values else match.group(0)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
