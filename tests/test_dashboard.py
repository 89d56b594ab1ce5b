"""The Grafana dashboard and the alert rules name only metrics the code exports.

Metric names are collected from fresh registries carrying every metrics class
a runlog process registers (broker, gateway, worker), expanded the way the
Prometheus exposition format does (`_total` for counters, `_bucket`/`_sum`/
`_count` for histograms). A renamed metric then fails here rather than as an
empty panel or an alert that can never fire.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from broker.metrics import BrokerMetrics
from gateway.metrics import GatewayMetrics
from workers.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Series Prometheus itself makes (not exported by runlog).
PROMETHEUS_BUILTINS = {"up"}
_METRIC_RE = re.compile(r"\b((?:runlog|process|python)_[a-z0-9_]+)\b")
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported_names() -> set[str]:
    names: set[str] = set()
    for build in (BrokerMetrics, GatewayMetrics, WorkerMetrics):
        registry = CollectorRegistry()
        build(registry)
        for family in registry.collect():
            names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return names


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DOCS / "grafana-dashboard.json").read_text())
    return data


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _panels(_dashboard()["panels"]) for t in p.get("targets", [])]


def _alerts() -> list[dict[str, Any]]:
    data = yaml.safe_load((DOCS / "alerts.yaml").read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def _balanced(expr: str) -> bool:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in expr:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                return False
    return not any(depth.values())


def test_dashboard_metrics_exist() -> None:
    names = exported_names()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 20
    for expr in exprs:
        used = set(_METRIC_RE.findall(expr))
        assert used, f"no runlog metric in {expr!r}"
        assert used <= names, f"unknown metrics {used - names} in {expr!r}"
        assert _balanced(expr), expr


def test_dashboard_covers_what_an_sre_asks_for() -> None:
    used = {m for e in _dashboard_exprs() for m in _METRIC_RE.findall(e)}
    for needed in (
        "runlog_events_appended_total",  # ingest rate
        "runlog_gateway_commit_to_queue_seconds_bucket",  # commit → client latency
        "runlog_append_latency_seconds_bucket",  # persist lag
        "runlog_publish_lag_seconds_bucket",  # publish lag
        "runlog_publish_backlog_messages",
        "runlog_append_pending_events",
        "runlog_gateway_connections",
        "runlog_gateway_slow_client_disconnects_total",
        "runlog_worker_abort_propagation_seconds_bucket",
        "runlog_worker_approvals_waiting",
        "runlog_runs_unfinished",  # runs by status
        "runlog_worker_runs_total",
        "runlog_worker_takeovers_total",
    ):
        assert needed in used, needed


def test_dashboard_is_well_formed() -> None:
    d = _dashboard()
    panels = list(_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert {t["refId"] for t in p["targets"]} == {
                chr(65 + i) for i in range(len(p["targets"]))
            }
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job"} <= variables


@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_alert_rules_reference_real_metrics_and_a_runbook(rule: dict[str, Any]) -> None:
    names = exported_names()
    expr = rule["expr"]
    used = set(_METRIC_RE.findall(expr))
    builtins = {n for n in PROMETHEUS_BUILTINS if re.search(rf"\b{n}\{{", expr)}
    assert used or builtins, f"{rule['alert']}: no metric in {expr!r}"
    assert used <= names, f"{rule['alert']}: unknown metrics {used - names}"
    assert _balanced(expr), expr
    assert rule["labels"]["severity"] in ("critical", "warning", "info")
    assert rule["annotations"]["summary"]
    # Each alert has a section in the runbook, found by its (Markdown) anchor.
    anchor = rule["annotations"]["runbook"].split("#", 1)[1]
    assert anchor == rule["alert"].lower()
    headings = re.findall(r"^#+ (.+)$", (DOCS / "operations.md").read_text(), re.MULTILINE)
    assert rule["alert"] in {h.strip().strip("`") for h in headings}, rule["alert"]
