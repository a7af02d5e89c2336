"""The "FSDP training on GPUs" Grafana dashboard, generated as plain JSON.

A pure function rather than a dashboard-as-code library: the dashboard is twenty panels of one
kind (a time series or a table over one PromQL query), which a few helpers express in less code
than a library's builder API, with nothing to install beside the Pulumi program. The tests read
the panels' queries from ``dashboard()`` and check each with promtool's parser and against the
exported metric names.

Starting point: the AWS blog's dashboard, fixed. Its memory panel used a metric that does not
exist (the right one is ``DCGM_FI_DEV_MEM_COPY_UTIL``) and it rated ``DCGM_FI_DEV_XID_ERRORS``,
which is a gauge holding the code of the last Xid: here it is a table of the last code per GPU.
Every DCGM panel is per GPU (``Hostname`` = node, ``gpu`` = index) and filterable by node; the
training panels come from the training package's ``fsdp_train_*`` metrics, one series per node
(local rank 0 of each node serves them).
"""

from __future__ import annotations

from typing import Any

from training import metric_names

UID = "fsdp-eks-gpu-training"
TITLE = "FSDP training on GPUs"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
DCGM_FILTER = 'Hostname=~"$node", gpu=~"$gpu"'
TRAINING_FILTER = 'namespace=~"$namespace"'
PER_GPU = "{{Hostname}} GPU {{gpu}}"
PER_POD = "{{pod}}"

_WIDTH = 24


def _timeseries(title: str, expr: str, *, unit: str, legend: str, description: str = "",
                minimum: float | None = None, maximum: float | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": "A", "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}],
    }


def _table(title: str, expr: str, *, description: str = "") -> dict[str, Any]:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": "none"}, "overrides": []},
        "options": {"showHeader": True},
        "targets": [
            {"refId": "A", "datasource": DATASOURCE, "expr": expr, "format": "table", "instant": True}
        ],
        "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
    }


def _row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def _dcgm(metric: str) -> str:
    return f"{metric}{{{DCGM_FILTER}}}"


def _training(metric: str) -> str:
    return f"{metric}{{{TRAINING_FILTER}}}"


def training_panels() -> list[dict[str, Any]]:
    """The job's own numbers, one series per node (pod)."""
    return [
        _timeseries("Loss", _training(metric_names.LOSS), unit="none", legend=PER_POD),
        _timeseries("Validation loss", f"{_training(metric_names.EVAL_LOSS)} > 0", unit="none",
                    legend=PER_POD,
                    description="Mean token loss over the whole validation set, at each evaluation "
                                "(--eval-every, default every epoch, and after the last step). Rising "
                                "while the training loss falls: overfitting."),
        _timeseries("Validation perplexity", f"{_training(metric_names.EVAL_PERPLEXITY)} > 0",
                    unit="none", legend=PER_POD, description="exp(validation loss)."),
        _timeseries("Tokens / s", _training(metric_names.TOKENS_PER_SECOND), unit="short", legend=PER_POD,
                    description="Throughput as reported by each node's rank 0."),
        _timeseries("Tokens / s / GPU", _training(metric_names.TOKENS_PER_SECOND_PER_GPU), unit="short",
                    legend=PER_POD),
        _timeseries("MFU", _training(metric_names.MFU_RATIO), unit="percentunit", legend=PER_POD,
                    minimum=0, maximum=1,
                    description="Model FLOPs utilisation: tokens/s/GPU x FLOPs/token / peak dense bf16."),
        _timeseries("Step time", _training(metric_names.STEP_SECONDS), unit="s", legend=PER_POD),
        _timeseries("Checkpoint age", f"time() - ({_training(metric_names.LAST_CHECKPOINT_TIMESTAMP)} > 0)",
                    unit="s", legend=PER_POD,
                    description="Seconds since the last distributed checkpoint: what a crash now would cost."),
        _timeseries("Seconds since last step",
                    f"time() - ({_training(metric_names.LAST_STEP_TIMESTAMP)} > 0)", unit="s",
                    legend=PER_POD, description="TrainingStalled fires when this passes 600 s for 5 minutes."),
        _timeseries("Steps / s", f"rate({_training(metric_names.STEPS_TOTAL)}[$__rate_interval])", unit="short",
                    legend=PER_POD),
        _timeseries("Step", _training(metric_names.STEP), unit="none", legend=PER_POD),
        _timeseries("Learning rate", _training(metric_names.LEARNING_RATE), unit="none", legend=PER_POD),
        _timeseries("Node check: bus bandwidth at start",
                    _training(metric_names.NODE_CHECK_BUSBW), unit="GBs",
                    legend="{{collective}} {{unit}} ({{scope}}) {{pod}}",
                    description="The check before training (training/node_check.py): nccl-tests bus "
                                "bandwidth of the all-reduce and all-gather at the sizes FSDP moves for "
                                "one layer and the root unit; scope job: over all ranks, node: inside "
                                "the node. A job whose check fails stops before training and is not "
                                "here: its log names the node and the figures."),
    ]


def gpu_panels() -> list[dict[str, Any]]:
    """The blog's six DCGM metrics under their right names, plus framebuffer and tensor cores."""
    return [
        _timeseries("GPU utilisation", _dcgm("DCGM_FI_DEV_GPU_UTIL"), unit="percent", legend=PER_GPU,
                    minimum=0, maximum=100),
        _timeseries("Tensor core activity", _dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), unit="percentunit",
                    legend=PER_GPU, minimum=0, maximum=1,
                    description="Fraction of cycles the tensor pipes are busy: closer to MFU than utilisation."),
        _timeseries("Memory copy utilisation", _dcgm("DCGM_FI_DEV_MEM_COPY_UTIL"), unit="percent",
                    legend=PER_GPU, minimum=0, maximum=100),
        _timeseries("Framebuffer used", _dcgm("DCGM_FI_DEV_FB_USED"), unit="mbytes", legend=PER_GPU),
        _timeseries("SM clock", _dcgm("DCGM_FI_DEV_SM_CLOCK"), unit="suffix: MHz", legend=PER_GPU),
        _timeseries("GPU temperature", _dcgm("DCGM_FI_DEV_GPU_TEMP"), unit="celsius", legend=PER_GPU),
        _timeseries("Power usage", _dcgm("DCGM_FI_DEV_POWER_USAGE"), unit="watt", legend=PER_GPU),
        _table("Last Xid per GPU", f"max by (Hostname, gpu) ({_dcgm('DCGM_FI_DEV_XID_ERRORS')}) > 0",
               description="The code of the last Xid (a gauge, not a count). 48, 64, 74, 79, 95, 119, 120: "
                           "replace or reset the GPU; 13, 31, 43: an application fault."),
    ]


def node_panels() -> list[dict[str, Any]]:
    """Per node: what a straggler looks like."""
    return [
        _timeseries("Mean GPU utilisation per node", f"avg by (Hostname) ({_dcgm('DCGM_FI_DEV_GPU_UTIL')})",
                    unit="percent", legend="{{Hostname}}", minimum=0, maximum=100),
        _timeseries("Power per node", f"sum by (Hostname) ({_dcgm('DCGM_FI_DEV_POWER_USAGE')})", unit="watt",
                    legend="{{Hostname}}"),
        _timeseries("Hottest GPU per node", f"max by (Hostname) ({_dcgm('DCGM_FI_DEV_GPU_TEMP')})",
                    unit="celsius", legend="{{Hostname}}"),
    ]


def health_panels() -> list[dict[str, Any]]:
    """The counters behind the health alerts."""
    rate = "rate({}[$__rate_interval])"
    return [
        _timeseries("Double-bit ECC errors (since driver load)", _dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                    unit="none", legend=PER_GPU),
        _timeseries("Row remap failure", _dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE"), unit="none", legend=PER_GPU),
        _timeseries("NVLink CRC flit errors / s", rate.format(_dcgm("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")),
                    unit="short", legend=PER_GPU),
        _timeseries("NVLink recoveries / s", rate.format(_dcgm("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")),
                    unit="short", legend=PER_GPU),
        _timeseries("PCIe replays / s", rate.format(_dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")), unit="short",
                    legend=PER_GPU),
        _timeseries("Thermal throttling", rate.format(_dcgm("DCGM_FI_DEV_THERMAL_VIOLATION")), unit="short",
                    legend=PER_GPU,
                    description="Growth of DCGM's throttle-time counter (ns per second; 1e9 = always "
                                "throttled). Anything above 0 costs speed."),
        _timeseries("Power throttling", rate.format(_dcgm("DCGM_FI_DEV_POWER_VIOLATION")), unit="short",
                    legend=PER_GPU,
                    description="Growth of DCGM's power-cap throttle-time counter (ns per second). Expected on "
                                "power-capped cards under a matmul-heavy load."),
    ]


def _variables() -> list[dict[str, Any]]:
    def query(name: str, label: str, promql: str) -> dict[str, Any]:
        return {
            "type": "query",
            "name": name,
            "label": label,
            "datasource": DATASOURCE,
            "query": {"query": promql, "refId": f"var-{name}"},
            "definition": promql,
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
        }

    return [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "current": {"text": "Prometheus", "value": "prometheus"}},
        query("namespace", "Job namespace", f"label_values({metric_names.STEP}, namespace)"),
        query("node", "Node", "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)"),
        query("gpu", "GPU", 'label_values(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node"}, gpu)'),
    ]


def _layout(sections: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows of two panels (half width, 8 high) under a row header per section; ids in order."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, section in sections:
        panels.append({**_row(title), "gridPos": {"h": 1, "w": _WIDTH, "x": 0, "y": y}})
        y += 1
        for i, panel in enumerate(section):
            panels.append({**panel, "gridPos": {"h": 8, "w": _WIDTH // 2, "x": (i % 2) * _WIDTH // 2, "y": y}})
            if i % 2 == 1 or i == len(section) - 1:
                y += 8
    for panel_id, panel in enumerate(panels, start=1):
        panel["id"] = panel_id
    return panels


def dashboard() -> dict[str, Any]:
    """The dashboard JSON model (Grafana schema 39), loaded by Grafana's dashboard sidecar."""
    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["fsdp-eks", "gpu", "dcgm", "training"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": _variables()},
        "annotations": {"list": []},
        "panels": _layout(
            [
                ("Training", training_panels()),
                ("GPUs (DCGM)", gpu_panels()),
                ("Nodes", node_panels()),
                ("GPU health", health_panels()),
            ]
        ),
    }


def queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of a dashboard model."""
    return [
        (panel["title"], target["expr"])
        for panel in model["panels"]
        for target in panel.get("targets", [])
    ]
