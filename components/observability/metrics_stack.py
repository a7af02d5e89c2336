"""The metrics stack and its storage: kube-prometheus-stack (Prometheus, Alertmanager, Grafana,
kube-state-metrics, node-exporter) and the alert rules it evaluates.

kube-prometheus-stack is a pinned Helm v3 release on the system nodes (node-exporter on every
node). Prometheus picks up every ServiceMonitor, PodMonitor and PrometheusRule of the cluster (the
``...SelectorNilUsesHelmValues`` values are false), so the training job's PodMonitor needs no
special label; ours carry ``release: <release>`` as well. Grafana is a ClusterIP service (reach it
with the exported ``kubectl port-forward`` command) whose admin password comes from the
``grafanaAdminPassword`` Pulumi secret through a Kubernetes Secret (``admin.existingSecret``),
never through Helm values, so it never appears in plain text in the release or the state. The
alert rules (``observability_rules.yaml``, plain rule groups that promtool tests) are a
``PrometheusRule``; Alertmanager's configuration is ``alert_delivery``'s.

Storage, and why ``pulumi destroy`` leaves no EBS volume behind. Prometheus keeps its samples on
an EBS gp3 volume (StorageClass ``<stack>-gp3``: ``reclaimPolicy: Delete``, encrypted, tagged
``fsdp-eks/stack=<stack>``). On a cluster this stack creates, the EBS CSI driver is the EKS add-on
``aws-ebs-csi-driver`` whose controller gets ``AmazonEBSCSIDriverPolicy`` through EKS Pod Identity
(the association exists before the add-on, so the controller pods start with credentials). On an
existing cluster the driver is assumed to be installed. The volume's claim is this component's own
resource (``prometheus_claim``), created under the name the Prometheus StatefulSet looks for
(``<volumeClaimTemplate name>-<StatefulSet>-0``), so the StatefulSet adopts it instead of creating
one Helm and Pulumi never see. The dependency graph then orders the deletes: the release (its
pods) first, then the claim (Pulumi waits until it is gone; ``reclaimPolicy: Delete`` hands its
volume to the driver), and only then the StorageClass and the EBS CSI add-on whose controller
deletes the volume. Deletion of the volume itself is asynchronous; should the cluster go before
the driver finishes, the tag finds the leftover:
``aws ec2 describe-volumes --filters Name=tag:fsdp-eks/stack,Values=<stack>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components import versions
from components.helm import helm_release
from components.observability.alert_delivery import (
    ALERTMANAGER_SERVICE_ACCOUNT,
    SLACK_SECRET,
    AlertDelivery,
    alertmanager_config,
    load_rule_groups,
)
from components.observability.common import (
    KPS_FULLNAME,
    MONITORING_NAMESPACE,
    EksAddonTarget,
    ObservabilityPart,
    eks_addon,
)
from components.observability.dashboard import DASHBOARD_LABEL
from components.settings import ObservabilitySettings

GRAFANA_SERVICE = "kps-grafana"
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_ADMIN_USER = "admin"
PROMETHEUS_VOLUME = "prometheus-db"
"""Name of the Prometheus volumeClaimTemplate (``storageSpec.volumeClaimTemplate.metadata.name``)."""
PROMETHEUS_CLAIM = f"{PROMETHEUS_VOLUME}-prometheus-{KPS_FULLNAME}-prometheus-0"
"""The claim the Prometheus StatefulSet mounts: ``<template>-<StatefulSet>-<ordinal>``; the operator
names the StatefulSet ``prometheus-<Prometheus name>`` and the chart the Prometheus
``<fullnameOverride>-prometheus`` (prometheus-operator's statefulset naming; one replica)."""
EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")


def kube_prometheus_stack_values(
    *, retention: str, storage_gib: int, storage_class: str, system_node_selector: Mapping[str, str],
    slack: bool = False, sns_topic_arn: str | None = None,
) -> dict[str, Any]:
    """Helm values of kube-prometheus-stack; no secret in here (the password and the Slack webhook
    are Secrets). ``slack``: the Slack webhook Secret exists; ``sns_topic_arn``: the SNS topic."""
    on_system = {"nodeSelector": dict(system_node_selector)}
    return {
        "fullnameOverride": KPS_FULLNAME,
        # EKS runs the control plane and binds kube-proxy's metrics to localhost: scraping them
        # only produces targets that are always down and rules that always fire.
        "kubeControllerManager": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "kubeEtcd": {"enabled": False},
        "kubeProxy": {"enabled": False},
        "prometheusOperator": {**on_system, "admissionWebhooks": {"patch": dict(on_system)}},
        "prometheus": {"prometheusSpec": _prometheus_spec(retention, storage_gib, storage_class, on_system)},
        "alertmanager": {
            "config": alertmanager_config(slack=slack, sns_topic_arn=sns_topic_arn),
            # Named, because its Pod Identity association names it.
            "serviceAccount": {"create": True, "name": ALERTMANAGER_SERVICE_ACCOUNT[1]},
            "alertmanagerSpec": {**on_system, "secrets": [SLACK_SECRET] if slack else []},
        },
        "grafana": _grafana_values(on_system),
        "kube-state-metrics": {
            **on_system,
            "fullnameOverride": f"{KPS_FULLNAME}-kube-state-metrics",
            # No rule or dashboard of ours or the chart's reads kube_secret_*: without that
            # collector its ClusterRole cannot list every Secret of the cluster.
            "collectorsExclude": ["secrets"],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "512Mi"}},
        },
        "prometheus-node-exporter": {
            "fullnameOverride": f"{KPS_FULLNAME}-node-exporter",
            # A DaemonSet that belongs everywhere, GPU nodes included: the chart's own default (any
            # NoSchedule taint, so the GPU taint too), spelt out so that it is not replaced by a
            # narrower list.
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
            "resources": {"requests": {"cpu": "20m", "memory": "32Mi"},
                          "limits": {"cpu": "250m", "memory": "128Mi"}},
            # It only reads /proc and /sys: no capability, no privilege escalation, the runtime's
            # default seccomp profile (the chart keeps its non-root user and read-only root).
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containerSecurityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        },
    }


def _prometheus_spec(retention: str, storage_gib: int, storage_class: str,
                     on_system: Mapping[str, Any]) -> dict[str, Any]:
    """``prometheus.prometheusSpec``: what it scrapes, how long it keeps it, its own volume."""
    return {
        **on_system,
        # Select every monitor and rule of the cluster, not only those labelled with
        # this release (the training job's PodMonitor lives in its own namespace).
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "probeSelectorNilUsesHelmValues": False,
        "scrapeConfigSelectorNilUsesHelmValues": False,
        "retention": retention,
        # Samples are dropped by age or before the disk fills, whichever comes first.
        "retentionSize": f"{int(storage_gib * 0.85)}GB",
        "storageSpec": {
            "volumeClaimTemplate": {
                "metadata": {"name": PROMETHEUS_VOLUME},
                "spec": {
                    "storageClassName": storage_class,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": f"{storage_gib}Gi"}},
                }
            }
        },
        # The claim is ours (module docstring): the StatefulSet must not garbage-collect it.
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}},
    }


def _grafana_values(on_system: Mapping[str, Any]) -> dict[str, Any]:
    """``grafana``: its admin Secret, its service, and the sidecar that loads our dashboard."""
    return {
        **on_system,
        "fullnameOverride": GRAFANA_SERVICE,
        "admin": {"existingSecret": GRAFANA_ADMIN_SECRET, "userKey": "admin-user", "passwordKey": "admin-password"},
        "service": {"type": "ClusterIP"},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "sidecar": {
            # The two sidecars that load dashboards and data sources from ConfigMaps.
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"cpu": "200m", "memory": "256Mi"}},
            "dashboards": {
                "enabled": True,
                "label": next(iter(DASHBOARD_LABEL)),
                "labelValue": DASHBOARD_LABEL["grafana_dashboard"],
                "searchNamespace": "ALL",
            },
        },
    }


def grafana_port_forward_command() -> str:
    """kubectl that makes Grafana reachable on http://localhost:3000."""
    return f"kubectl -n {MONITORING_NAMESPACE} port-forward svc/{GRAFANA_SERVICE} 3000:80"


def storage_class_name(name: str) -> str:
    """The StorageClass of Prometheus' volume, for the stack's ``<project>-<stack>``."""
    return f"{name}-gp3"


@dataclass(frozen=True, kw_only=True)
class MetricsStackArgs:
    """Inputs of ``MetricsStack``."""

    name: str
    """Prefix of physical names (the stack's ``<project>-<stack>``)."""
    settings: ObservabilitySettings
    provider: k8s.Provider
    namespace: k8s.core.v1.Namespace
    grafana_admin_password: pulumi.Input[str]
    """The ``grafanaAdminPassword`` Pulumi secret."""
    alert_delivery: AlertDelivery
    """Where Alertmanager sends the alerts; its Secret and credentials exist before Alertmanager."""
    system_node_selector: Mapping[str, str]
    """Where Prometheus, Grafana and the operator run: the cluster's system nodes."""
    eks: EksAddonTarget | None = None
    """None on an existing cluster: its EBS CSI driver is assumed, no add-on is created."""
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)


class MetricsStack(ObservabilityPart):
    """kube-prometheus-stack with Prometheus' volume (EBS CSI driver, StorageClass, claim), Grafana's
    admin Secret and the alert rules."""

    def __init__(self, name: str, args: MetricsStackArgs, opts: pulumi.ResourceOptions):
        super().__init__("fsdp-eks:observability:MetricsStack", f"{name}-metrics", args.provider, args.ready, opts)
        s = args.settings
        self.ebs_csi_driver = (
            eks_addon(self, f"{name}-ebs-csi", args.eks, "aws-ebs-csi-driver", EBS_CSI_SERVICE_ACCOUNT,
                      EBS_CSI_POLICY)
            if args.eks is not None else None
        )
        self.storage_class = self._storage_class(name, args)
        self.grafana_admin_secret = self._grafana_admin_secret(name, args)
        self.prometheus_claim = self._prometheus_claim(name, args)
        delivery = args.alert_delivery
        self.stack_release = helm_release(
            f"{name}-kps",
            versions.KUBE_PROMETHEUS_STACK,
            MONITORING_NAMESPACE,
            kube_prometheus_stack_values(
                retention=s.prometheus_retention,
                storage_gib=s.prometheus_storage_gib,
                storage_class=storage_class_name(args.name),
                system_node_selector=args.system_node_selector,
                slack=delivery.slack_secret is not None,
                sns_topic_arn=s.alert_sns_topic_arn,
            ),
            self.in_cluster(
                args.namespace,
                self.grafana_admin_secret,
                *delivery.alertmanager_ready,
                self.storage_class,
                self.prometheus_claim,
                *([self.ebs_csi_driver] if self.ebs_csi_driver is not None else []),
            ),
        )
        self.alert_rules = k8s.apiextensions.CustomResource(
            f"{name}-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={
                "name": "fsdp-eks-alerts",
                "namespace": MONITORING_NAMESPACE,
                "labels": {"release": self.stack_release.name},
            },
            spec=load_rule_groups(),
            opts=self.in_cluster(self.stack_release),
        )
        self.register_outputs({"release_name": self.stack_release.name,
                               "storage_class": storage_class_name(args.name)})

    def _storage_class(self, name: str, args: MetricsStackArgs) -> k8s.storage.v1.StorageClass:
        return k8s.storage.v1.StorageClass(
            f"{name}-gp3",
            metadata={"name": storage_class_name(args.name)},
            provisioner="ebs.csi.aws.com",
            parameters={"type": "gp3", "encrypted": "true", "tagSpecification_1": f"fsdp-eks/stack={args.name}"},
            reclaim_policy="Delete",
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            opts=self.in_cluster(*([self.ebs_csi_driver] if self.ebs_csi_driver is not None else [])),
        )

    def _prometheus_claim(self, name: str, args: MetricsStackArgs) -> k8s.core.v1.PersistentVolumeClaim:
        """Prometheus' claim, ours so that destroy deletes it before the EBS CSI driver (module
        docstring). Unbound until Prometheus starts (``WaitForFirstConsumer``): no await."""
        return k8s.core.v1.PersistentVolumeClaim(
            f"{name}-prometheus-claim",
            metadata={"name": PROMETHEUS_CLAIM, "namespace": MONITORING_NAMESPACE,
                      "annotations": {"pulumi.com/skipAwait": "true"}},
            spec={
                "storageClassName": storage_class_name(args.name),
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": f"{args.settings.prometheus_storage_gib}Gi"}},
            },
            opts=self.in_cluster(args.namespace, self.storage_class),
        )

    def _grafana_admin_secret(self, name: str, args: MetricsStackArgs) -> k8s.core.v1.Secret:
        return k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": MONITORING_NAMESPACE},
            type="Opaque",
            string_data={
                "admin-user": GRAFANA_ADMIN_USER,
                "admin-password": pulumi.Output.secret(args.grafana_admin_password),
            },
            opts=self.in_cluster(args.namespace),
        )
