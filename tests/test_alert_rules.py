"""The alert rules, checked by promtool (Prometheus 2.42, Debian's `prometheus` package).

`promtool check rules` parses the rule groups the component loads; `promtool test rules` runs
tests/fixtures/observability/alert_rules_test.yaml, where every alert has series that fire it and a
healthy cluster where nothing fires. Missing promtool skips these tests on a workstation and fails
them under CI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from components.observability.alert_delivery import RULES_FILE, load_rule_groups
from tests.observability_promql import known_metrics, metric_names, promtool

FIXTURE = Path(__file__).parent / "fixtures" / "observability" / "alert_rules_test.yaml"
CRITICAL_XIDS = {48, 64, 74, 79, 95, 119, 120}
"""Xids after which the GPU needs a reset or replacing (NVIDIA's Xid catalog)."""
APPLICATION_XIDS = {13, 31, 43, 45}
"""Xids that are the application's fault: the job's own failure is the signal, not an alert."""


def alerts() -> list[dict]:
    return [rule for group in load_rule_groups()["groups"] for rule in group["rules"] if "alert" in rule]


def unit_tests() -> list[dict]:
    return yaml.safe_load(FIXTURE.read_text())["tests"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_promtool_accepts_the_rule_groups():
    result = run(promtool(), "check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass(tmp_path: Path):
    """Every alert fires on its series and stays quiet on the healthy ones (promtool's verdict)."""
    groups = load_rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            # promtool compares rendered annotations verbatim; labels and firing are what is tested
            # here, annotation templates in test_annotations_name_only_labels_of_the_alert.
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    result = run(promtool(), "test", "rules", FIXTURE.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in unit_tests():
        for case in test["alert_rule_test"]:
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts without a series that fires them"
    assert names - quiet == set(), "alerts without a case where they must stay quiet"
    assert (fired | quiet) - names == set(), "the unit tests name alerts that do not exist"


def test_every_alert_is_actionable():
    """Severity, a `for`, and a summary, description and runbook for whoever is paged."""
    for alert in alerts():
        name = alert["alert"]
        assert alert.get("labels", {}).get("severity") in ("critical", "warning"), name
        assert re.fullmatch(r"\d+[smh]", alert.get("for", "")), f"{name}: give it a `for`"
        assert {"summary", "description", "runbook"} <= set(alert.get("annotations", {})), name


def test_annotations_name_only_labels_of_the_alert():
    """A `$labels.x` the alert does not carry renders as "<no value>" in the page."""
    expected: dict[str, list[set[str]]] = {}
    for test in unit_tests():
        for case in test["alert_rule_test"]:
            for alert in case.get("exp_alerts") or []:
                expected.setdefault(case["alertname"], []).append(set(alert["exp_labels"]))
    for alert in alerts():
        text = " ".join(alert["annotations"].values())
        used = set(re.findall(r"\$labels\.(\w+)", text))
        for labels in expected[alert["alert"]]:
            assert used <= labels, f"{alert['alert']} annotations use {used - labels}, absent from the alert"


def test_critical_xids_are_the_ones_that_need_a_reset():
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    codes = {int(c) for c in re.findall(r"DCGM_FI_DEV_XID_ERRORS\s*==\s*(\d+)", exprs["GpuXidCritical"])}
    assert codes == CRITICAL_XIDS
    every_xid_code = {int(c) for e in exprs.values() for c in re.findall(r"DCGM_FI_DEV_XID_ERRORS\s*==\s*(\d+)", e)}
    assert every_xid_code & APPLICATION_XIDS == set(), "application faults are not paged"


def test_xid_is_never_rated():
    """DCGM_FI_DEV_XID_ERRORS holds the last Xid code: a rate or increase of it means nothing."""
    for alert in alerts():
        assert not re.search(r"(rate|increase|irate|delta)\(\s*DCGM_FI_DEV_XID_ERRORS", alert["expr"]), alert["alert"]


def test_rules_use_only_exported_metrics():
    """No rule can stay silent because of a typo: every series it reads is exported."""
    known = known_metrics()
    for alert in alerts():
        names = metric_names(alert["expr"])
        assert names, f"{alert['alert']}: no metric found in its expression"
        assert names <= set(known), f"{alert['alert']} reads {names - set(known)}, which nothing exports"


def test_metric_name_reader_reads_what_promql_selects():
    """The reader behind the metric checks: selectors, not functions, labels, keywords or strings."""
    expr = ('sum by (Hostname) (rate(a_total{job=~"x.*"}[5m] offset 1h)) / 1e9 > 0.5 '
            'and on (Hostname) label_replace(max(b), "c", "$1", "d", "(.+)") or vector(0) unless c:rec')
    assert metric_names(expr) == {"a_total", "b", "c:rec"}


def test_unit_tests_feed_only_exported_series():
    """The promtool unit tests' input series use the names the exporters serve, so a renamed
    metric cannot leave the rules tested against series nothing produces."""
    known = known_metrics()
    for test in unit_tests():
        for series in test["input_series"]:
            names = metric_names(series["series"])
            assert names and names <= set(known), f"{series['series']}: {names - set(known)}"
