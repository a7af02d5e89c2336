"""See every GPU and every training step: Prometheus, Grafana, dcgm-exporter, dashboard, alerts.

``Observability`` installs, in the ``monitoring`` namespace:

- **kube-prometheus-stack** (pinned Helm v3 release) on the system nodes. Prometheus picks up
  every ServiceMonitor, PodMonitor and PrometheusRule of the cluster (the
  ``...SelectorNilUsesHelmValues`` values are false), so the training job's PodMonitor needs no
  special label; ours carry ``release: <release>`` as well. Grafana is a ClusterIP service (reach
  it with the exported ``kubectl port-forward`` command) whose admin password comes from the
  ``grafanaAdminPassword`` Pulumi secret through a Kubernetes Secret (``admin.existingSecret``),
  never through Helm values, so it never appears in plain text in the release or the state.
- **dcgm-exporter** (pinned Helm v3 release) on the GPU nodes only, tolerating their taint, with
  the metrics list of ``dcgm_metrics.csv`` (the chart's defaults plus ECC, NVLink, throttling).
- The **dashboard** (``components/dashboards/gpu_training.py``) as a ConfigMap labelled
  ``grafana_dashboard: "1"`` and the **alert rules** (``observability_rules.yaml``, plain rule
  groups that promtool tests) as a ``PrometheusRule``.
- Optional: the **CloudWatch** observability add-on with its own DCGM exporter off, and an
  **htop/nvtop** DaemonSet on the GPU nodes.

Storage, and why ``pulumi destroy`` leaves no EBS volume behind. Prometheus keeps its samples on
an EBS gp3 volume (StorageClass ``<stack>-gp3``: ``reclaimPolicy: Delete``, encrypted, tagged
``fsdp-eks/stack=<stack>``). On a cluster this stack creates, the EBS CSI driver is the EKS add-on
``aws-ebs-csi-driver`` whose controller gets ``AmazonEBSCSIDriverPolicy`` through EKS Pod Identity
(the association exists before the add-on, so the controller pods start with credentials). On an
existing cluster the driver is assumed to be installed. The volume's claim is created by the
Prometheus StatefulSet, not by Helm, so ``helm uninstall`` alone would leave it (and its volume)
behind. Two things close that gap: the Prometheus spec sets
``persistentVolumeClaimRetentionPolicy.whenDeleted: Delete`` (the StatefulSet owns its claim, so
deleting the release garbage-collects StatefulSet -> claim -> volume, ``reclaimPolicy: Delete``),
and the release depends on the StorageClass and the EBS CSI add-on, so destroy removes the release
first and the driver that deletes the EBS volume afterwards. Deletion of the volume is
asynchronous; should the cluster go before the driver finishes, the tag finds the leftover:
``aws ec2 describe-volumes --filters Name=tag:fsdp-eks/stack,Values=<stack>``.

The training job's PodMonitor (components/training_job.py) needs the monitoring CRDs: pass
``depends_on=[observability]`` (or ``observability.stack_release``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import yaml

from components import versions
from components.dashboards import gpu_training
from components.gpu_nodes import gpu_node_placement
from components.helm import helm_release
from components.pod_identity import pod_identity_role
from components.settings import ObservabilitySettings

MONITORING_NAMESPACE = "monitoring"
KPS_FULLNAME = "kps"
"""``fullnameOverride`` of kube-prometheus-stack: object names do not depend on the release name."""
GRAFANA_SERVICE = "kps-grafana"
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_ADMIN_USER = "admin"
DCGM_FULLNAME = "dcgm-exporter"
"""Name of the exporter's DaemonSet and Service, hence the ``job`` label of its series."""
DCGM_COUNTERS_PATH = "/etc/dcgm-exporter/default-counters.csv"
"""Where the chart mounts ``customMetrics`` (ConfigMap ``exporter-metrics-config-map``, key
``metrics``; chart 4.8.3 ``extraConfigMapVolumes`` default); passed with ``-f`` explicitly."""
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DEBUG_TOOLS_NAME = "gpu-debug-tools"

RULES_FILE = Path(__file__).with_name("observability_rules.yaml")
DCGM_METRICS_FILE = Path(__file__).with_name("dcgm_metrics.csv")

TRAINING_METRICS: dict[str, str] = {
    "fsdp_train_step": "gauge",
    "fsdp_train_steps_total": "counter",
    "fsdp_train_loss": "gauge",
    "fsdp_train_learning_rate": "gauge",
    "fsdp_train_tokens_per_second": "gauge",
    "fsdp_train_tokens_per_second_per_gpu": "gauge",
    "fsdp_train_mfu_ratio": "gauge",
    "fsdp_train_step_seconds": "gauge",
    "fsdp_train_last_checkpoint_timestamp_seconds": "gauge",
    "fsdp_train_last_step_timestamp_seconds": "gauge",
    "fsdp_train_eval_loss": "gauge",
    "fsdp_train_eval_perplexity": "gauge",
}
"""What the training package exports (names fixed with the training package's author)."""

EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")
CLOUDWATCH_POLICY = "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"
CLOUDWATCH_SERVICE_ACCOUNT = ("amazon-cloudwatch", "cloudwatch-agent")


# --------------------------------------------------------------------------- data and values


def load_rule_groups() -> dict[str, Any]:
    """The alert rule groups (``{"groups": [...]}``), exactly as promtool reads them."""
    return yaml.safe_load(RULES_FILE.read_text())


def dcgm_metrics_csv() -> str:
    """The exporter's complete metrics list (dcgm-exporter CSV: field, type, help)."""
    return DCGM_METRICS_FILE.read_text()


def dcgm_exported_metrics(text: str | None = None) -> dict[str, str]:
    """Metric name -> Prometheus type of every field a dcgm-exporter CSV (``text``; default the
    repository's) configures the exporter to export."""
    text = dcgm_metrics_csv() if text is None else text
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {row[0].strip(): row[1].strip() for row in csv.reader(lines)}


def kube_prometheus_stack_values(
    *, retention: str, storage_gib: int, storage_class: str, system_node_selector: Mapping[str, str]
) -> dict[str, Any]:
    """Helm values of kube-prometheus-stack; no secret in here (the password is a Secret)."""
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
        "prometheus": {
            "prometheusSpec": {
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
                        "spec": {
                            "storageClassName": storage_class,
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": f"{storage_gib}Gi"}},
                        }
                    }
                },
                # The StatefulSet's claim goes with it: no orphaned EBS volume (module docstring).
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
                "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}},
            }
        },
        "alertmanager": {"alertmanagerSpec": dict(on_system)},
        "grafana": {
            **on_system,
            "fullnameOverride": GRAFANA_SERVICE,
            "admin": {"existingSecret": GRAFANA_ADMIN_SECRET, "userKey": "admin-user", "passwordKey": "admin-password"},
            "service": {"type": "ClusterIP"},
            "sidecar": {
                "dashboards": {
                    "enabled": True,
                    "label": next(iter(DASHBOARD_LABEL)),
                    "labelValue": DASHBOARD_LABEL["grafana_dashboard"],
                    "searchNamespace": "ALL",
                }
            },
        },
        "kube-state-metrics": dict(on_system),
        # A DaemonSet that belongs everywhere, GPU nodes included: the chart's own default (any
        # NoSchedule taint), spelt out so that it is not replaced by a narrower list.
        "prometheus-node-exporter": {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]},
    }


def dcgm_exporter_values(*, release_label: pulumi.Input[str]) -> dict[str, Any]:
    """Helm values of dcgm-exporter: GPU nodes only, our metrics list, a ServiceMonitor."""
    return {
        "fullnameOverride": DCGM_FULLNAME,
        "arguments": ["-f", DCGM_COUNTERS_PATH],
        "customMetrics": dcgm_metrics_csv(),
        **gpu_node_placement(),
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": release_label}},
    }


def cloudwatch_configuration() -> dict[str, Any]:
    """``configuration_values`` of the amazon-cloudwatch-observability add-on.

    ``accelerated_compute_metrics: false`` is the add-on's documented opt-out of GPU metrics; the
    CloudWatch agent operator then deploys no DCGM exporter of its own (two exporters on one GPU
    would both hold DCGM's profiling module and compete for it). Container Insights keeps its
    node, pod and container metrics and the container logs.
    """
    kubernetes = {"enhanced_container_insights": True, "accelerated_compute_metrics": False}
    return {"agent": {"config": {"logs": {"metrics_collected": {"kubernetes": kubernetes}}}}}


def grafana_port_forward_command() -> str:
    """kubectl that makes Grafana reachable on http://localhost:3000."""
    return f"kubectl -n {MONITORING_NAMESPACE} port-forward svc/{GRAFANA_SERVICE} 3000:80"


def debug_tools_spec() -> dict[str, Any]:
    """DaemonSet spec of the htop/nvtop pods: ``kubectl exec -it <pod> -- nvtop``.

    No maintained public image ships nvtop, so a pinned CUDA base image installs htop and nvtop
    from Ubuntu when the pod starts (the nodes reach the Ubuntu mirrors through the NAT gateway;
    without network the pod still starts and says so in its log). ``hostPID`` lets htop see the
    training processes; ``NVIDIA_VISIBLE_DEVICES=all`` without a GPU request lets nvtop see every
    GPU without taking one from the scheduler.
    """
    labels = {"app.kubernetes.io/name": DEBUG_TOOLS_NAME}
    install = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "htop nvtop >/dev/null && echo 'htop and nvtop installed' "
        "|| echo 'installing htop/nvtop failed: no route to the Ubuntu mirrors?'; exec sleep infinity"
    )
    return {
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "hostPID": True,
                **gpu_node_placement(),
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "tools",
                        "image": versions.DEBUG_TOOLS_IMAGE,
                        "command": ["bash", "-c", install],
                        "env": [
                            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                        ],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "64Mi"},
                            "limits": {"memory": "512Mi"},
                        },
                    }
                ],
            },
        },
    }


# --------------------------------------------------------------------------- the component


@dataclass(frozen=True, kw_only=True)
class EksAddonTarget:
    """The EKS cluster this stack creates, which gets the EBS CSI (and CloudWatch) add-ons."""

    cluster_name: pulumi.Input[str]
    kubernetes_version: str
    """Picks the add-on versions in ``versions.EKS_ADDONS``."""


@dataclass(frozen=True, kw_only=True)
class ObservabilityArgs:
    """Inputs of ``Observability``."""

    name: str
    """Prefix of physical names (the stack's ``<project>-<stack>``)."""
    settings: ObservabilitySettings
    provider: k8s.Provider
    grafana_admin_password: pulumi.Input[str]
    """The ``grafanaAdminPassword`` Pulumi secret."""
    system_node_selector: Mapping[str, str]
    """Where Prometheus, Grafana and the operator run: the cluster's system nodes."""
    eks: EksAddonTarget | None = None
    """None on an existing cluster: its EBS CSI driver is assumed, no add-on is created."""
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What must exist first: the Pod Identity agent and the system nodes everything runs on."""


class Observability(pulumi.ComponentResource):
    """kube-prometheus-stack, dcgm-exporter, dashboard and alerts; CloudWatch and debug tools."""

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:observability:Observability", name, None, opts)
        s = args.settings
        self.ebs_csi_driver = self._ebs_csi_driver(name, args) if args.eks is not None else None
        self.storage_class = self._storage_class(name, args)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": MONITORING_NAMESPACE},
            opts=self._in_cluster(args),
        )
        self.grafana_admin_secret = self._grafana_admin_secret(name, args)
        self.stack_release = helm_release(
            f"{name}-kps",
            versions.KUBE_PROMETHEUS_STACK,
            MONITORING_NAMESPACE,
            kube_prometheus_stack_values(
                retention=s.prometheus_retention,
                storage_gib=s.prometheus_storage_gib,
                storage_class=self.storage_class_name(args),
                system_node_selector=args.system_node_selector,
            ),
            self._in_cluster(
                args,
                self.namespace,
                self.grafana_admin_secret,
                self.storage_class,
                *([self.ebs_csi_driver] if self.ebs_csi_driver is not None else []),
            ),
        )
        self.release_name = self.stack_release.name
        self.dcgm_release = helm_release(
            f"{name}-dcgm",
            versions.DCGM_EXPORTER,
            MONITORING_NAMESPACE,
            dcgm_exporter_values(release_label=self.release_name),
            self._in_cluster(args, self.stack_release),
        )
        self.alert_rules = k8s.apiextensions.CustomResource(
            f"{name}-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={
                "name": "fsdp-eks-alerts",
                "namespace": MONITORING_NAMESPACE,
                "labels": {"release": self.release_name},
            },
            spec=load_rule_groups(),
            opts=self._in_cluster(args, self.stack_release),
        )
        self.dashboard = k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={
                "name": f"{gpu_training.UID}-dashboard",
                "namespace": MONITORING_NAMESPACE,
                "labels": dict(DASHBOARD_LABEL),
            },
            data={f"{gpu_training.UID}.json": json.dumps(gpu_training.dashboard(), indent=1)},
            opts=self._in_cluster(args, self.namespace),
        )
        self.cloudwatch = (
            self._cloudwatch(name, args) if s.cloudwatch_container_insights and args.eks is not None else None
        )
        self.debug_tools = (
            k8s.apps.v1.DaemonSet(
                f"{name}-debug-tools",
                metadata={"name": DEBUG_TOOLS_NAME, "namespace": MONITORING_NAMESPACE},
                spec=debug_tools_spec(),
                opts=self._in_cluster(args, self.namespace),
            )
            if s.debug_tools
            else None
        )
        self.grafana_port_forward_command = grafana_port_forward_command()
        self.register_outputs(
            {
                "release_name": self.release_name,
                "dcgm_release_name": self.dcgm_release.name,
                "storage_class": self.storage_class_name(args),
                "grafana_port_forward_command": self.grafana_port_forward_command,
            }
        )

    @staticmethod
    def storage_class_name(args: ObservabilityArgs) -> str:
        return f"{args.name}-gp3"

    def _in_cluster(self, args: ObservabilityArgs, *after: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[*args.ready, *after])

    def _ebs_csi_driver(self, name: str, args: ObservabilityArgs) -> aws.eks.Addon:
        return self._addon(f"{name}-ebs-csi", args, "aws-ebs-csi-driver", EBS_CSI_SERVICE_ACCOUNT, EBS_CSI_POLICY)

    def _addon(
        self, resource_name: str, args: ObservabilityArgs, addon_name: str, service_account: tuple[str, str],
        policy_arn: str, *after: pulumi.Resource, configuration_values: str | None = None,
    ) -> aws.eks.Addon:
        """A pinned EKS add-on whose service account gets ``policy_arn`` through Pod Identity
        (the association exists first, so its pods start with credentials)."""
        assert args.eks is not None
        _, first = pod_identity_role(
            resource_name, cluster_name=args.eks.cluster_name, service_account=service_account,
            policy_arn=policy_arn, parent=self, ready=args.ready,
        )
        return aws.eks.Addon(
            resource_name,
            cluster_name=args.eks.cluster_name,
            addon_name=addon_name,
            addon_version=versions.EKS_ADDONS[args.eks.kubernetes_version][addon_name],
            configuration_values=configuration_values,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*first, *args.ready, *after]),
        )

    def _storage_class(self, name: str, args: ObservabilityArgs) -> k8s.storage.v1.StorageClass:
        return k8s.storage.v1.StorageClass(
            f"{name}-gp3",
            metadata={"name": self.storage_class_name(args)},
            provisioner="ebs.csi.aws.com",
            parameters={"type": "gp3", "encrypted": "true", "tagSpecification_1": f"fsdp-eks/stack={args.name}"},
            reclaim_policy="Delete",
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            opts=self._in_cluster(args, *([self.ebs_csi_driver] if self.ebs_csi_driver is not None else [])),
        )

    def _grafana_admin_secret(self, name: str, args: ObservabilityArgs) -> k8s.core.v1.Secret:
        return k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": MONITORING_NAMESPACE},
            type="Opaque",
            string_data={
                "admin-user": GRAFANA_ADMIN_USER,
                "admin-password": pulumi.Output.secret(args.grafana_admin_password),
            },
            opts=self._in_cluster(args, self.namespace),
        )

    def _cloudwatch(self, name: str, args: ObservabilityArgs) -> aws.eks.Addon:
        """Container Insights, its own DCGM exporter off (``cloudwatch_configuration``)."""
        return self._addon(
            f"{name}-cloudwatch", args, "amazon-cloudwatch-observability", CLOUDWATCH_SERVICE_ACCOUNT,
            CLOUDWATCH_POLICY,
            # After kube-prometheus-stack: its monitoring CRDs are then already in place.
            self.stack_release,
            configuration_values=json.dumps(cloudwatch_configuration()),
        )
