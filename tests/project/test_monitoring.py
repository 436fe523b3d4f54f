"""deploy/monitoring: the Grafana dashboard and the Prometheus rules a team running tpuwatch imports.

Checked for real, with Prometheus' own promtool (Debian's `prometheus` package; .ci/run installs
it, and the tests that need it skip without it):
- the rule file passes `promtool check rules`, and its unit tests (`promtool test rules`) pass,
  with a firing and a not-firing case for every alert;
- every PromQL expression of the dashboard parses (promtool checks them as recording rules);
- every metric name the dashboard and the rules use is one the exporter serves, read from the
  exporter itself (the families of a Snapshot with every field set), or a recording rule the rule
  file defines: renaming a metric in tpuwatch/metrics.py fails here;
- the dashboard uses stock panels only, the datasource variable everywhere, a fleet row and a row
  repeated per job;
- the PrometheusRule of deploy/kubernetes/components/rules carries exactly the rule file's groups
  (TPUWATCH_SYNC_RULES=1 rewrites it from the rule file), and every alert has a runbook entry.
The kustomize build of the component is in test_deploy.py, with the other manifests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.exposition import generate_latest

from tpuwatch import metrics
from tpuwatch.policy import Phase

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "deploy" / "monitoring"
RULES = MON / "tpuwatch.rules.yaml"
RULE_TESTS = MON / "tpuwatch.rules.test.yaml"
DASHBOARD = MON / "tpuwatch.dashboard.json"
PROMETHEUSRULE = REPO / "deploy" / "kubernetes" / "components" / "rules" / "prometheusrule.yaml"
RUNBOOK = REPO / "docs" / "alerts-and-metrics.md"
STOCK_PANELS = {"row", "stat", "timeseries", "table", "bargauge", "gauge", "state-timeline", "text"}
PROMETHEUS_BUILTINS = {"ALERTS", "ALERTS_FOR_STATE", "up"}
# What Grafana substitutes before the query reaches Prometheus, with values that parse.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$job": "llm-pod"}


# ---------------------------------------------------------------------------------------------
# helpers


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package; .ci/run installs it)")
    return tool


def full_snapshot() -> metrics.Snapshot:
    """A Snapshot with every field set, so every family the exporter can serve is served."""
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    snap = metrics.Snapshot(
        job="llm-pod", time=t, phase=Phase.RUNNING.value, attempt=3, restarts=1, max_restarts=3, recreates=1,
        max_recreates=2, restarts_charged_total=1, recreates_total=1, disruptions={"preempted": 1},
        checkpoint_step=100, checkpoint_time=t - timedelta(minutes=5), resumes=(42.0,), goodput=0.9,
        api_requests={("tpu.googleapis.com", "get_node"): 7}, api_errors={("tpu.googleapis.com", "get_node"): 1},
        priority=100, slots_lent=1, nodes_taken=1, pool="v5p", pool_nodes=(("sp-0", "llm-pod", ""), ("sp-1", "", "")))
    for name, value in dataclasses.asdict(snap).items():
        assert value not in (None, {}, ()), f"full_snapshot() leaves {name} empty"
    return snap


def exported_names() -> set[str]:
    """Every sample name /metrics serves, as the exporter renders it (with _total, _bucket...)."""
    registry, _ = metrics.registry_for(full_snapshot())
    text = generate_latest(registry).decode()
    return {re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", ln).group() for ln in text.splitlines()  # type: ignore[union-attr]
            if ln and not ln.startswith("#")}


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
             "unless", "inf", "nan", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels, keywords)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    e = re.sub(r"\boffset\s+-?\w+", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.group() in _KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def dashboard() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return d


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs(d: dict[str, Any]) -> list[str]:
    """Every PromQL expression the dashboard sends, its Grafana variables as Prometheus gets them."""
    raw = [t["expr"] for p in panels(d) for t in p.get("targets", [])]
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])
            assert m, var["definition"]
            raw.append(m.group(1))
    out = []
    for e in raw:
        for var, value in GRAFANA_VARIABLES.items():
            e = e.replace(var, value)
        assert "$" not in e, f"a Grafana variable this test does not know: {e}"
        out.append(e)
    return out


def unknown_names(exprs: list[str], exported: set[str]) -> dict[str, set[str]]:
    recorded = {r["record"] for r in rules() if "record" in r}
    known = exported | recorded | PROMETHEUS_BUILTINS
    return {e: metric_names(e) - known for e in exprs if metric_names(e) - known}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# the metric names


def test_the_name_extraction_finds_metrics_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.9, sum by (le) (rate(a_bucket{job_name=~"x|y", k="b c"}[5m]))) '
            '/ on (job_name) group_left b:rec offset 1h > 1e3 and c unless ignoring (kind) d[1h:1m]')
    assert metric_names(expr) == {"a_bucket", "b:rec", "c", "d"}


def test_the_dashboard_and_the_rules_use_only_metrics_the_exporter_serves() -> None:
    exported = exported_names()
    assert {"tpuwatch_goodput_ratio", "tpuwatch_time_to_resume_seconds_bucket", "tpuwatch_disruptions_total",
            "tpuwatch_last_tick_timestamp_seconds"} <= exported
    exprs = dashboard_exprs(dashboard()) + [r["expr"] for r in rules()]
    assert unknown_names(exprs, exported) == {}
    used = set().union(*(metric_names(e) for e in exprs))
    # The dashboard and the rules together cover what the exporter serves (the histogram by its
    # buckets, sum and count; tpuwatch_checkpoint_step and _timestamp are for ad-hoc queries).
    unused = exported - used - {"tpuwatch_checkpoint_step", "tpuwatch_checkpoint_timestamp_seconds",
                                "tpuwatch_time_to_resume_seconds_created"}
    assert unused == set(), unused


def test_renaming_an_exported_metric_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    gauge: Callable[..., Any] = metrics._gauge
    monkeypatch.setattr(metrics, "_gauge", lambda name, *a: gauge(name.replace("_ratio", ""), *a))
    exprs = dashboard_exprs(dashboard()) + [r["expr"] for r in rules()]
    missing = set().union(*unknown_names(exprs, exported_names()).values())
    assert missing == {"tpuwatch_goodput_ratio"}


# ---------------------------------------------------------------------------------------------
# the rules


def test_the_rules_pass_promtool_check_and_their_unit_tests() -> None:
    promtool = _promtool()
    out = _run([promtool, "check", "rules", RULES.name], MON)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    out = _run([promtool, "test", "rules", RULE_TESTS.name], MON)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_unit_tests_are_real(tmp_path: Path) -> None:
    """A changed threshold fails them: they pin the rules, not just run them."""
    promtool = _promtool()
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    changed = text.replace("[1h])) > 900", "[1h])) > 1800")  # TpuwatchWatcherStale's threshold
    assert changed != text
    (tmp_path / RULES.name).write_text(changed)
    out = _run([promtool, "test", "rules", RULE_TESTS.name], tmp_path)
    assert out.returncode != 0 and "TpuwatchWatcherStale" in out.stdout + out.stderr, out.stdout


def test_every_alert_has_a_firing_and_a_not_firing_unit_test_and_a_runbook_entry() -> None:
    cases: dict[str, list[int]] = {}
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in t.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(len(case.get("exp_alerts") or []))
    runbook = RUNBOOK.read_text()
    for a in alerts():
        name = a["alert"]
        assert any(n > 0 for n in cases.get(name, [])), f"{name}: no unit test where it fires"
        assert 0 in cases.get(name, []), f"{name}: no unit test where it does not fire"
        assert a["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description", "runbook"} <= a["annotations"].keys(), name
        anchor = a["annotations"]["runbook"]
        assert anchor == f"docs/alerts-and-metrics.md#{name.lower()}", anchor
        assert re.search(rf"^#### `{name}`$", runbook, re.M), f"docs/alerts-and-metrics.md has no runbook for {name}"
    assert set(cases) == {a["alert"] for a in alerts()}, "a unit test for an alert that does not exist"


def test_the_prometheusrule_carries_exactly_the_rule_files_groups() -> None:
    doc = yaml.safe_load(PROMETHEUSRULE.read_text())
    if os.environ.get("TPUWATCH_SYNC_RULES") == "1":
        header = "".join(ln + "\n" for ln in PROMETHEUSRULE.read_text().splitlines() if ln.startswith("#"))
        doc["spec"] = {"groups": rule_groups()}
        PROMETHEUSRULE.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["spec"] == {"groups": rule_groups()}, \
        "deploy/kubernetes/components/rules/prometheusrule.yaml differs from deploy/monitoring/tpuwatch.rules.yaml: " \
        "TPUWATCH_SYNC_RULES=1 pytest tests/project/test_monitoring.py -k prometheusrule rewrites it"


# ---------------------------------------------------------------------------------------------
# the dashboard


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    promtool = _promtool()
    exprs = dashboard_exprs(dashboard())
    rule_file = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:expr_{i}", "expr": e}
                                                            for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.rules.yaml").write_text(yaml.safe_dump(rule_file))
    out = _run([promtool, "check", "rules", "dashboard.rules.yaml"], tmp_path)
    assert out.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in out.stdout, out.stdout + out.stderr
    # The check is real: a broken expression fails it.
    rule_file["groups"][0]["rules"].append({"record": "dashboard:broken", "expr": "sum by (job_name (x)"})
    (tmp_path / "dashboard.rules.yaml").write_text(yaml.safe_dump(rule_file))
    assert _run([promtool, "check", "rules", "dashboard.rules.yaml"], tmp_path).returncode != 0


def test_the_dashboard_has_stock_panels_a_fleet_row_and_a_row_per_job() -> None:
    d = dashboard()
    assert "__requires" not in d or all(r["type"] != "panel" or r["id"] in STOCK_PANELS for r in d["__requires"])
    ps = list(panels(d))
    assert {p["type"] for p in ps} <= STOCK_PANELS, {p["type"] for p in ps}
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    job = variables["job"]
    assert job["multi"] and job["includeAll"]
    for p in ps:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert "$job" in t["expr"] or "job_name" not in t["expr"], (p["title"], t["expr"])
    rows = [p for p in d["panels"] if p["type"] == "row"]
    assert [r.get("repeat") for r in rows] == [None, "job"], "a fleet row, then a row repeated per job"
    titles = {p["title"] for p in ps}
    for needed in ("Phase", "Goodput", "Attempt", "Restarts and recreates against their budgets", "Time to resume",
                   "Disruptions by kind (per hour)", "Goodput by job", "Jobs that need a person",
                   "Google API requests and errors /s"):
        assert needed in titles, needed
