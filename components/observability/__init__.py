"""See every GPU and every training step: ``Observability`` wires its parts in the ``monitoring``
namespace, one module per concern:

- ``metrics_stack``: kube-prometheus-stack (Prometheus, Alertmanager, Grafana,
  kube-state-metrics, node-exporter) with Prometheus' storage, and the alert rules;
- ``alert_delivery``: Alertmanager's routes, the Slack webhook Secret and the SNS role;
- ``gpu_telemetry``: dcgm-exporter on the GPU nodes;
- ``dashboard``: the GPU training dashboard as a ConfigMap;
- ``extras``: the optional CloudWatch add-on and htop/nvtop DaemonSet.

The training job's PodMonitor (components/training_job.py) needs the monitoring CRDs: pass
``depends_on=[observability]`` (or ``observability.stack_release``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components.observability.alert_delivery import AlertDelivery, AlertDeliveryArgs
from components.observability.common import MONITORING_NAMESPACE, EksAddonTarget
from components.observability.dashboard import Dashboard, DashboardArgs
from components.observability.extras import ObservabilityExtras, ObservabilityExtrasArgs
from components.observability.gpu_telemetry import GpuTelemetry, GpuTelemetryArgs
from components.observability.metrics_stack import (
    MetricsStack,
    MetricsStackArgs,
    grafana_port_forward_command,
    storage_class_name,
)
from components.settings import ObservabilitySettings

__all__ = ["EksAddonTarget", "Observability", "ObservabilityArgs"]


@dataclass(frozen=True, kw_only=True)
class ObservabilityArgs:
    """Inputs of ``Observability``."""

    name: str
    """Prefix of physical names (the stack's ``<project>-<stack>``)."""
    settings: ObservabilitySettings
    provider: k8s.Provider
    grafana_admin_password: pulumi.Input[str]
    """The ``grafanaAdminPassword`` Pulumi secret."""
    alert_slack_webhook: pulumi.Input[str] | None = None
    """The ``alertSlackWebhook`` Pulumi secret; None: no Slack delivery."""
    system_node_selector: Mapping[str, str]
    """Where Prometheus, Grafana and the operator run: the cluster's system nodes."""
    gpu_instance_type: str
    """The profile's instance type: dcgm-exporter and the debug tools run on nodes of this type."""
    eks: EksAddonTarget | None = None
    """None on an existing cluster: its EBS CSI driver is assumed, no add-on is created."""
    dcgm_host_engine: pulumi.Resource | None = None
    """The cluster's ``dcgm_host_engine``: what dcgm-exporter reads and waits for (None: it embeds one)."""
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What must exist first: the Pod Identity agent and the system nodes everything runs on."""


class Observability(pulumi.ComponentResource):
    """kube-prometheus-stack, dcgm-exporter, dashboard and alerts; CloudWatch and debug tools."""

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:observability:Observability", name, None, opts)
        s, ready, part = args.settings, args.ready, pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": MONITORING_NAMESPACE},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(ready)),
        )
        self.alert_delivery = AlertDelivery(name, AlertDeliveryArgs(
            provider=args.provider, namespace=self.namespace, sns_topic_arn=s.alert_sns_topic_arn,
            alert_slack_webhook=args.alert_slack_webhook, eks=args.eks, ready=ready), part)
        self.metrics = MetricsStack(name, MetricsStackArgs(
            name=args.name, settings=s, provider=args.provider, namespace=self.namespace,
            grafana_admin_password=args.grafana_admin_password, alert_delivery=self.alert_delivery,
            system_node_selector=args.system_node_selector, eks=args.eks, ready=ready), part)
        self.stack_release = self.metrics.stack_release
        self.release_name = self.stack_release.name
        self.gpu_telemetry = GpuTelemetry(name, GpuTelemetryArgs(
            provider=args.provider, gpu_instance_type=args.gpu_instance_type, stack_release=self.stack_release,
            dcgm_host_engine=args.dcgm_host_engine, ready=ready), part)
        self.dashboard = Dashboard(name, DashboardArgs(provider=args.provider, namespace=self.namespace, ready=ready),
                                   part)
        cloudwatch = args.eks if s.cloudwatch_container_insights else None
        self.extras = ObservabilityExtras(name, ObservabilityExtrasArgs(
            provider=args.provider, namespace=self.namespace, stack_release=self.stack_release,
            gpu_instance_type=args.gpu_instance_type, cloudwatch=cloudwatch, debug_tools=s.debug_tools,
            ready=ready), part) if cloudwatch is not None or s.debug_tools else None
        self.grafana_port_forward_command = grafana_port_forward_command()
        self.register_outputs(
            {
                "release_name": self.release_name,
                "dcgm_release_name": self.gpu_telemetry.dcgm_release.name,
                "storage_class": storage_class_name(args.name),
                "grafana_port_forward_command": self.grafana_port_forward_command,
            }
        )
