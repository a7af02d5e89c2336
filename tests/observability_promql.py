"""Helpers of the observability tests: find promtool, read metric names out of PromQL."""

from __future__ import annotations

import re

from components.observability.gpu_telemetry import dcgm_exported_metrics
from tests.harness import require_tool
from training import metric_names as training_metrics

OTHER_SOURCES = {
    "up": "Prometheus itself: one series per scrape target",
    "kube_node_status_allocatable": "kube-state-metrics, installed by kube-prometheus-stack",
    "kube_node_status_condition": "kube-state-metrics: every node condition, the node monitoring agent's too",
    "kube_pod_container_resource_requests": "kube-state-metrics",
    "kube_pod_status_phase": "kube-state-metrics",
    "kube_node_spec_taint": "kube-state-metrics: one series per taint of each node (key, value, effect)",
}
"""Series the rules use that neither dcgm-exporter nor the training package exports."""

GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$node": ".*",
    "$gpu": ".*",
    "$namespace": ".*",
}
"""What Grafana puts in place of its variables (the "All" value for ours) before a query runs."""

_AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
                 "count_values", "limitk", "limit_ratio"}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
             "offset", "atan2", "inf", "nan", *_AGGREGATIONS}


def promtool() -> str:
    """Path of promtool (tests.harness.require_tool: a failure under CI, a skip elsewhere)."""
    return require_tool("promtool", "install Debian's `prometheus` package (.ci/run does)")


def known_metrics(dcgm_csv: str | None = None) -> dict[str, str]:
    """Every metric name a query may use, with where it comes from: what dcgm-exporter exports
    with ``dcgm_csv`` (default: components/dcgm_metrics.csv), what the training package serves
    (training.metric_names, checked against its registry in tests/training/test_prometheus.py),
    and ``OTHER_SOURCES``."""
    return {
        **{name: "dcgm-exporter" for name in dcgm_exported_metrics(dcgm_csv)},
        **{name: "training package" for name in training_metrics.SERVED},
        **OTHER_SOURCES,
    }


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Drops string literals, label matchers, range and subquery brackets, numbers and the label
    lists of by/without/on/ignoring/group_*; what remains is operators, function names (followed
    by a parenthesis), keywords and metric names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", text)
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        token = match.group(0)
        if token in _KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(token)
    return names


def substitute_grafana_variables(expr: str) -> str:
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(variable, value)
    return expr
