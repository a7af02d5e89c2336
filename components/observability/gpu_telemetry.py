"""GPU telemetry: dcgm-exporter on every GPU node.

A pinned Helm v3 release on the GPU nodes only (by instance type, tolerating their taint), with the
metrics list of ``dcgm_metrics.csv`` (the chart's defaults plus ECC, NVLink, throttling) and a
ServiceMonitor that Prometheus picks up.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components import versions
from components.gpu_nodes import gpu_node_placement
from components.helm import helm_release
from components.observability.common import MONITORING_NAMESPACE, ObservabilityPart

DCGM_FULLNAME = "dcgm-exporter"
"""Name of the exporter's DaemonSet and Service, hence the ``job`` label of its series."""
DCGM_COUNTERS_PATH = "/etc/dcgm-exporter/default-counters.csv"
"""Where the chart mounts ``customMetrics`` (ConfigMap ``exporter-metrics-config-map``, key
``metrics``; chart 4.8.2 ``extraConfigMapVolumes`` default); passed with ``-f`` explicitly."""
DCGM_METRICS_FILE = Path(__file__).parents[1] / "dcgm_metrics.csv"


def dcgm_metrics_csv() -> str:
    """The exporter's complete metrics list (dcgm-exporter CSV: field, type, help)."""
    return DCGM_METRICS_FILE.read_text()


def dcgm_exported_metrics(text: str | None = None) -> dict[str, str]:
    """Metric name -> Prometheus type of every field a dcgm-exporter CSV (``text``; default the
    repository's) configures the exporter to export."""
    text = dcgm_metrics_csv() if text is None else text
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {row[0].strip(): row[1].strip() for row in csv.reader(lines)}


def dcgm_exporter_values(*, release_label: pulumi.Input[str], gpu_instance_type: str,
                         agent_host_engine: bool) -> dict[str, Any]:
    """Helm values of dcgm-exporter: GPU nodes only (by instance type), our metrics list, a
    ServiceMonitor. With ``agent_host_engine`` it runs no host engine of its own: it reads the
    node's one host engine, the node monitoring agent's
    (``versions.NODE_MONITORING_AGENT_DCGM_HOST_ENGINE``), over the host network (the chart's
    ``-r <host>:<port>`` argument and ``hostNetwork``). Without (a cluster where the stack
    installs no agent) it embeds one, the chart's default: ``-r`` to a port nothing listens on
    would crash-loop the exporter and fail its atomic release."""
    arguments = ["-f", DCGM_COUNTERS_PATH]
    if agent_host_engine:
        arguments += ["-r", versions.NODE_MONITORING_AGENT_DCGM_HOST_ENGINE]
    return {
        "fullnameOverride": DCGM_FULLNAME,
        "arguments": arguments,
        "hostNetwork": agent_host_engine,
        "customMetrics": dcgm_metrics_csv(),
        **gpu_node_placement(gpu_instance_type),
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": release_label}},
    }


@dataclass(frozen=True, kw_only=True)
class GpuTelemetryArgs:
    """Inputs of ``GpuTelemetry``."""

    provider: k8s.Provider
    gpu_instance_type: str
    """The profile's instance type: dcgm-exporter runs on nodes of this type."""
    stack_release: k8s.helm.v3.Release
    """kube-prometheus-stack: its ServiceMonitor CRD first, its release name as the monitor's label."""
    dcgm_host_engine: pulumi.Resource | None = None
    """The add-on whose host engine the exporter reads (the release waits for it); None: it embeds one."""
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)


class GpuTelemetry(ObservabilityPart):
    """dcgm-exporter on the GPU nodes."""

    def __init__(self, name: str, args: GpuTelemetryArgs, opts: pulumi.ResourceOptions):
        super().__init__("fsdp-eks:observability:GpuTelemetry", f"{name}-gpu-telemetry", args.provider, args.ready,
                         opts)
        self.dcgm_release = helm_release(
            f"{name}-dcgm",
            versions.DCGM_EXPORTER,
            MONITORING_NAMESPACE,
            dcgm_exporter_values(release_label=args.stack_release.name, gpu_instance_type=args.gpu_instance_type,
                                 agent_host_engine=args.dcgm_host_engine is not None),
            self.in_cluster(args.stack_release, *([args.dcgm_host_engine] if args.dcgm_host_engine else [])),
        )
        self.register_outputs({"dcgm_release_name": self.dcgm_release.name})
