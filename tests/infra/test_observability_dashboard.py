"""The Grafana dashboard: every query parses (promtool) and reads an exported metric.

Checked against promtool's PromQL parser (each panel query becomes a recording rule of a
generated rules file), the exporter's metrics list (components/dcgm_metrics.csv) and the metrics
the training package serves (``training.metric_names``, which tests/training/test_prometheus.py
checks against the package's prometheus_client registry).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from components.dashboards import gpu_training
from components.observability.gpu_telemetry import dcgm_exported_metrics
from tests.observability_promql import (
    known_metrics,
    metric_names,
    promtool,
    substitute_grafana_variables,
)
from training import metric_names as training_metrics

BLOG_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
}
"""The six metrics of the AWS blog's dashboard, under their right names."""


@pytest.fixture(scope="module")
def model() -> dict:
    return gpu_training.dashboard()


def variable_queries(model: dict) -> list[tuple[str, str]]:
    """(variable, the series selector inside its label_values(...) query)."""
    found = []
    for var in model["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"])
            assert match, f"variable {var['name']}: expected label_values(selector, label)"
            found.append((var["name"], match.group(1)))
    return found


def test_every_query_parses_with_promtool(model: dict, tmp_path: Path):
    exprs = [e for _, e in gpu_training.queries(model)] + [s for _, s in variable_queries(model)]
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": substitute_grafana_variables(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_every_query_reads_an_exported_metric(model: dict):
    """No panel can show "No data" because of a misspelt metric name."""
    known = known_metrics()
    for title, expr in gpu_training.queries(model) + variable_queries(model):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr}"
        assert names <= set(known), f"panel {title!r} reads {names - set(known)}, which nothing exports"


def test_blog_metrics_and_more_per_gpu(model: dict):
    used = {name for _, expr in gpu_training.queries(model) for name in metric_names(expr)}
    assert BLOG_METRICS <= used
    assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= used
    for title, expr in gpu_training.queries(model):
        if any(name.startswith("DCGM_") for name in metric_names(expr)):
            # Filterable by node and GPU; per GPU unless aggregated per node on purpose.
            assert 'Hostname=~"$node"' in expr and 'gpu=~"$gpu"' in expr, title


def test_training_panels(model: dict):
    by_title = dict(gpu_training.queries(model))
    expected = {
        "Loss": training_metrics.LOSS,
        "Tokens / s": training_metrics.TOKENS_PER_SECOND,
        "Tokens / s / GPU": training_metrics.TOKENS_PER_SECOND_PER_GPU,
        "MFU": training_metrics.MFU_RATIO,
        "Step time": training_metrics.STEP_SECONDS,
        "Checkpoint age": training_metrics.LAST_CHECKPOINT_TIMESTAMP,
    }
    for title, metric in expected.items():
        assert metric_names(by_title[title]) == {metric}, title
    assert by_title["Checkpoint age"].startswith("time() - "), "age, not the raw timestamp"


def test_counters_are_rated_and_gauges_are_not(model: dict):
    """rate() of a gauge (the blog's Xid panel) or a raw counter plot are both wrong."""
    types = {**dcgm_exported_metrics(), **training_metrics.SERVED}
    for title, expr in gpu_training.queries(model):
        for name in metric_names(expr):
            rated = re.search(rf"(rate|increase|irate)\({re.escape(name)}\b", expr) is not None
            if types[name] == "gauge":
                assert not rated, f"{title}: {name} is a gauge"
            elif name != "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":  # shown as a level: any value > 0 matters
                assert rated, f"{title}: {name} is a counter, plot its rate"


def test_layout_and_identity(model: dict):
    ids = [p["id"] for p in model["panels"]]
    assert ids == list(range(1, len(ids) + 1))
    assert len(model["uid"]) <= 40, "Grafana's limit on a dashboard uid"
    for panel in model["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_validation_loss_panel_beside_the_training_loss(model: dict):
    """The validation loss and perplexity the training package serves are charted, the loss in
    the same row as the training loss (same y, the other half), skipping the 0 a gauge holds
    before the first evaluation."""
    panels = {p["title"]: p for p in model["panels"]}
    by_title = dict(gpu_training.queries(model))
    assert metric_names(by_title["Validation loss"]) == {training_metrics.EVAL_LOSS}
    assert metric_names(by_title["Validation perplexity"]) == {training_metrics.EVAL_PERPLEXITY}
    assert by_title["Validation loss"].endswith("> 0")
    loss, val = panels["Loss"]["gridPos"], panels["Validation loss"]["gridPos"]
    assert loss["y"] == val["y"] and {loss["x"], val["x"]} == {0, loss["w"]}
