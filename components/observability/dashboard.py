"""The dashboard: ``components/dashboards/gpu_training.py`` as a ConfigMap that Grafana's sidecar
loads (label ``grafana_dashboard: "1"``, any namespace)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components.dashboards import gpu_training
from components.observability.common import MONITORING_NAMESPACE, ObservabilityPart

DASHBOARD_LABEL = {"grafana_dashboard": "1"}


@dataclass(frozen=True, kw_only=True)
class DashboardArgs:
    """Inputs of ``Dashboard``."""

    provider: k8s.Provider
    namespace: k8s.core.v1.Namespace
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)


class Dashboard(ObservabilityPart):
    """The GPU training dashboard, as a ConfigMap."""

    def __init__(self, name: str, args: DashboardArgs, opts: pulumi.ResourceOptions):
        super().__init__("fsdp-eks:observability:Dashboard", f"{name}-dashboards", args.provider, args.ready, opts)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={
                "name": f"{gpu_training.UID}-dashboard",
                "namespace": MONITORING_NAMESPACE,
                "labels": dict(DASHBOARD_LABEL),
            },
            data={f"{gpu_training.UID}.json": json.dumps(gpu_training.dashboard(), indent=1)},
            opts=self.in_cluster(args.namespace),
        )
        self.register_outputs({})
