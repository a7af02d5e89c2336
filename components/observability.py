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

Alert delivery. Alertmanager (part of kube-prometheus-stack) routes every alert of
``observability_rules.yaml`` to one receiver, ``fsdp-eks``: Slack when the ``alertSlackWebhook``
secret is set, SNS when ``observability.alertSnsTopicArn`` is, or both; the chart's own alerts keep
its ``null`` receiver. The webhook URL never enters Helm values (which a preview diff shows and the
release stores): it lives in a Kubernetes Secret that ``alertmanagerSpec.secrets`` mounts at
``/etc/alertmanager/secrets/<secret>/<key>``, and the Slack config names that file
(``api_url_file``, Alertmanager >= 0.22). SNS publishing signs with the credentials of a Pod Identity
role for Alertmanager's service account whose one permission is ``sns:Publish`` on that topic, and
with the region of the topic's ARN (without one Alertmanager cannot sign: prometheus-operator#5130).
With neither set, preview warns that the alerts reach no one. ``alertmanager_config`` is the whole
configuration (every top-level key of the chart's default, so nothing of that default survives
Helm's merge), and the tests run ``amtool check-config`` and ``amtool config routes test`` on it.

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

from components import checkov, versions
from components.cluster import ADDON_CONFLICT_RESOLUTION
from components.dashboards import gpu_training
from components.gpu_nodes import gpu_node_placement
from components.helm import helm_release
from components.pod_identity import inline_policy, pod_identity_role
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
``metrics``; chart 4.8.2 ``extraConfigMapVolumes`` default); passed with ``-f`` explicitly."""
PROMETHEUS_VOLUME = "prometheus-db"
"""Name of the Prometheus volumeClaimTemplate (``storageSpec.volumeClaimTemplate.metadata.name``)."""
PROMETHEUS_CLAIM = f"{PROMETHEUS_VOLUME}-prometheus-{KPS_FULLNAME}-prometheus-0"
"""The claim the Prometheus StatefulSet mounts: ``<template>-<StatefulSet>-<ordinal>``; the operator
names the StatefulSet ``prometheus-<Prometheus name>`` and the chart the Prometheus
``<fullnameOverride>-prometheus`` (prometheus-operator's statefulset naming; one replica)."""
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DEBUG_TOOLS_NAME = "gpu-debug-tools"
DEBUG_TOOLS_CHECKOV_SKIPS = {
    "CKV_K8S_17": "hostPID is the tool's purpose: htop must see the training processes",
    "CKV_K8S_23": "root: the pod apt-installs htop and nvtop when it starts (no maintained image ships nvtop)",
    "CKV_K8S_40": "root, for the same apt-get install",
    "CKV_K8S_37": "apt-get needs root's file and setuid capabilities (it drops to the _apt user to download); "
                  "NET_RAW is dropped",
    "CKV_K8S_22": "apt-get writes to the root filesystem",
    "CKV_K8S_8": "an idle shell for kubectl exec: nothing to probe",
    "CKV_K8S_9": "an idle shell for kubectl exec: nothing to probe",
    "CKV_K8S_43": "CUDA base image pinned by exact tag in components/versions.py; no digest offline",
}
"""Why the opt-in htop/nvtop DaemonSet cannot meet these checks (components/checkov.py)."""

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
    "fsdp_node_check_busbw_gigabytes_per_second": "gauge",
    "fsdp_node_check_storage_megabytes_per_second": "gauge",
    "fsdp_node_check_seconds": "gauge",
}
"""What the training package exports (names fixed with the training package's author)."""

EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")
CLOUDWATCH_POLICY = "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"
CLOUDWATCH_SERVICE_ACCOUNT = ("amazon-cloudwatch", "cloudwatch-agent")
CLOUDWATCH_IMDS_FALLBACK = ["ec2:DescribeInstances"]
"""What the CloudWatch agent calls when IMDS is closed to pods (components/node_metadata.py):
amazon-cloudwatch-agent#1139 / #1149; ``CloudWatchAgentServerPolicy`` does not grant it."""

CONTAINER_INSIGHTS_LOG_GROUPS = ("application", "dataplane", "host", "performance")
"""The log groups the CloudWatch observability add-on writes, ``/aws/containerinsights/<cluster>/<kind>``
(CloudWatch user guide: Fluent Bit's application, dataplane and host logs, "Set up Fluent Bit as a
DaemonSet to send logs to CloudWatch Logs"; the agent's performance log events, "Container Insights
performance log reference"). The agent and Fluent Bit create missing ones without expiry, unknown to
the stack: ours exist first, with the stack's retention, and ``pulumi destroy`` deletes them."""


def log_group(cluster_name: str, kind: str) -> str:
    """The name of Container Insights' ``kind`` log group of ``cluster_name``."""
    return f"/aws/containerinsights/{cluster_name}/{kind}"


ALERT_RECEIVER = "fsdp-eks"
"""The Alertmanager receiver of every alert in ``observability_rules.yaml``."""
NULL_RECEIVER = "null"
"""The chart's receiver of everything else (its default route): delivered nowhere."""
ALERTMANAGER_SERVICE_ACCOUNT = (MONITORING_NAMESPACE, f"{KPS_FULLNAME}-alertmanager")
SLACK_SECRET = "alertmanager-slack"
SLACK_SECRET_KEY = "webhook-url"
ALERTMANAGER_SECRETS_DIR = "/etc/alertmanager/secrets"
"""Where the operator mounts each ``alertmanagerSpec.secrets`` entry, one folder per Secret."""
SLACK_WEBHOOK_FILE = f"{ALERTMANAGER_SECRETS_DIR}/{SLACK_SECRET}/{SLACK_SECRET_KEY}"


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


def alert_names() -> list[str]:
    """Every alert of ``observability_rules.yaml``, in file order."""
    return [rule["alert"] for group in load_rule_groups()["groups"] for rule in group["rules"] if "alert" in rule]


def sns_region(topic_arn: str) -> str:
    """The region field of an SNS topic ARN (``arn:aws:sns:<region>:<account>:<name>``)."""
    return topic_arn.split(":")[3]


def alert_receiver(*, slack: bool, sns_topic_arn: str | None) -> dict[str, Any] | None:
    """The ``fsdp-eks`` receiver: Slack through the mounted webhook file, SNS through Pod Identity."""
    receiver: dict[str, Any] = {"name": ALERT_RECEIVER}
    if slack:
        receiver["slack_configs"] = [{"api_url_file": SLACK_WEBHOOK_FILE, "send_resolved": True}]
    if sns_topic_arn is not None:
        receiver["sns_configs"] = [{
            "topic_arn": sns_topic_arn,
            "sigv4": {"region": sns_region(sns_topic_arn)},
            "subject": '{{ template "sns.default.subject" . }}',
            "send_resolved": True,
        }]
    return receiver if len(receiver) > 1 else None


def alertmanager_config(*, slack: bool, sns_topic_arn: str | None) -> dict[str, Any]:
    """Alertmanager's whole configuration: our alerts to ``fsdp-eks`` (when it has a target), the
    rest (the chart's own alerts, its Watchdog) to ``null``. No secret in here: Slack's URL is a file."""
    receiver = alert_receiver(slack=slack, sns_topic_arn=sns_topic_arn)
    ours = "|".join(alert_names())
    routes = [{"receiver": NULL_RECEIVER, "matchers": ['alertname = "Watchdog"']}]
    if receiver is not None:
        routes.insert(0, {
            "receiver": ALERT_RECEIVER,
            "matchers": [f'alertname =~ "{ours}"'],
            "group_by": ["alertname", "namespace"],
            # A failing GPU or a stalled run costs node-hours: repeat sooner than the chart's 12h.
            "repeat_interval": "4h",
        })
    return {
        "global": {"resolve_timeout": "5m"},
        # A critical alert silences the warning of the same name and namespace (the chart's default).
        "inhibit_rules": [{
            "source_matchers": ["severity = critical"],
            "target_matchers": ["severity =~ warning|info"],
            "equal": ["namespace", "alertname"],
        }],
        "route": {
            "group_by": ["namespace"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "receiver": NULL_RECEIVER,
            "routes": routes,
        },
        "receivers": [{"name": NULL_RECEIVER}, *([receiver] if receiver is not None else [])],
        "templates": ["/etc/alertmanager/config/*.tmpl"],
    }


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
        },
        "alertmanager": {
            "config": alertmanager_config(slack=slack, sns_topic_arn=sns_topic_arn),
            # Named, because its Pod Identity association names it.
            "serviceAccount": {"create": True, "name": ALERTMANAGER_SERVICE_ACCOUNT[1]},
            "alertmanagerSpec": {**on_system, "secrets": [SLACK_SECRET] if slack else []},
        },
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


def dcgm_exporter_values(*, release_label: pulumi.Input[str], gpu_instance_type: str) -> dict[str, Any]:
    """Helm values of dcgm-exporter: GPU nodes only (by instance type), our metrics list, a
    ServiceMonitor, and no host engine of its own: it reads the node's one host engine, the node
    monitoring agent's (``versions.NODE_MONITORING_AGENT_DCGM_HOST_ENGINE``), over the host
    network (the chart's ``-r <host>:<port>`` argument and ``hostNetwork``)."""
    return {
        "fullnameOverride": DCGM_FULLNAME,
        "arguments": ["-f", DCGM_COUNTERS_PATH, "-r", versions.NODE_MONITORING_AGENT_DCGM_HOST_ENGINE],
        "hostNetwork": True,
        "customMetrics": dcgm_metrics_csv(),
        **gpu_node_placement(gpu_instance_type),
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


def debug_tools_spec(gpu_instance_type: str) -> dict[str, Any]:
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
                **gpu_node_placement(gpu_instance_type),
                "terminationGracePeriodSeconds": 1,
                "automountServiceAccountToken": False,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    {
                        "name": "tools",
                        "image": versions.DEBUG_TOOLS_IMAGE,
                        "imagePullPolicy": "Always",
                        "command": ["bash", "-c", install],
                        # Root for apt-get (DEBUG_TOOLS_CHECKOV_SKIPS), but never more than root.
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "privileged": False,
                            "capabilities": {"drop": ["NET_RAW"]},
                        },
                        "env": [
                            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                        ],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "64Mi"},
                            "limits": {"cpu": "1", "memory": "512Mi"},
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
    log_retention_days: int
    """Retention of the log groups the CloudWatch add-on writes to (``cluster.logRetentionDays``)."""


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
        self.prometheus_claim = self._prometheus_claim(name, args)
        self.slack_secret = self._slack_secret(name, args)
        self.alertmanager_credentials = self._alertmanager_credentials(name, args)
        self.stack_release = helm_release(
            f"{name}-kps",
            versions.KUBE_PROMETHEUS_STACK,
            MONITORING_NAMESPACE,
            kube_prometheus_stack_values(
                retention=s.prometheus_retention,
                storage_gib=s.prometheus_storage_gib,
                storage_class=self.storage_class_name(args),
                system_node_selector=args.system_node_selector,
                slack=self.slack_secret is not None,
                sns_topic_arn=s.alert_sns_topic_arn,
            ),
            self._in_cluster(
                args,
                self.namespace,
                self.grafana_admin_secret,
                *([self.slack_secret] if self.slack_secret is not None else []),
                *self.alertmanager_credentials,
                self.storage_class,
                self.prometheus_claim,
                *([self.ebs_csi_driver] if self.ebs_csi_driver is not None else []),
            ),
        )
        self.release_name = self.stack_release.name
        self.dcgm_release = helm_release(
            f"{name}-dcgm",
            versions.DCGM_EXPORTER,
            MONITORING_NAMESPACE,
            dcgm_exporter_values(release_label=self.release_name, gpu_instance_type=args.gpu_instance_type),
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
        self.debug_tools, self.debug_tools_network_policy = (
            self._debug_tools(name, args) if s.debug_tools else (None, None)
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
        extra_actions: list[str] | None = None,
    ) -> aws.eks.Addon:
        """A pinned EKS add-on whose service account gets ``policy_arn`` (and ``extra_actions``,
        inline) through Pod Identity (the association exists first, so its pods start with credentials)."""
        assert args.eks is not None
        _, first = pod_identity_role(
            resource_name, cluster_name=args.eks.cluster_name, service_account=service_account,
            policy_arn=policy_arn, inline=inline_policy(extra_actions) if extra_actions else None,
            parent=self, ready=args.ready,
        )
        return aws.eks.Addon(
            resource_name,
            cluster_name=args.eks.cluster_name,
            addon_name=addon_name,
            addon_version=versions.EKS_ADDONS[args.eks.kubernetes_version][addon_name],
            resolve_conflicts_on_create=ADDON_CONFLICT_RESOLUTION,
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

    def _prometheus_claim(self, name: str, args: ObservabilityArgs) -> k8s.core.v1.PersistentVolumeClaim:
        """Prometheus' claim, ours so that destroy deletes it before the EBS CSI driver (module
        docstring). Unbound until Prometheus starts (``WaitForFirstConsumer``): no await."""
        return k8s.core.v1.PersistentVolumeClaim(
            f"{name}-prometheus-claim",
            metadata={"name": PROMETHEUS_CLAIM, "namespace": MONITORING_NAMESPACE,
                      "annotations": {"pulumi.com/skipAwait": "true"}},
            spec={
                "storageClassName": self.storage_class_name(args),
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": f"{args.settings.prometheus_storage_gib}Gi"}},
            },
            opts=self._in_cluster(args, self.namespace, self.storage_class),
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

    def _debug_tools(
        self, name: str, args: ObservabilityArgs
    ) -> tuple[k8s.apps.v1.DaemonSet, k8s.networking.v1.NetworkPolicy]:
        """The htop/nvtop DaemonSet, and a NetworkPolicy that admits nothing to its pods (they serve
        nothing; ``kubectl exec`` goes through the kubelet, not the pod network)."""
        spec = debug_tools_spec(args.gpu_instance_type)
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-debug-tools-network-policy",
            metadata={"name": DEBUG_TOOLS_NAME, "namespace": MONITORING_NAMESPACE},
            spec={"podSelector": {"matchLabels": spec["selector"]["matchLabels"]},
                  "policyTypes": ["Ingress"], "ingress": []},
            opts=self._in_cluster(args, self.namespace),
        )
        daemon_set = k8s.apps.v1.DaemonSet(
            f"{name}-debug-tools",
            metadata={"name": DEBUG_TOOLS_NAME, "namespace": MONITORING_NAMESPACE,
                      "annotations": checkov.skip_annotations(DEBUG_TOOLS_CHECKOV_SKIPS)},
            spec=spec,
            opts=self._in_cluster(args, self.namespace),
        )
        return daemon_set, policy

    def _slack_secret(self, name: str, args: ObservabilityArgs) -> k8s.core.v1.Secret | None:
        """The Slack webhook URL, as the file Alertmanager reads (never in Helm values)."""
        if args.alert_slack_webhook is None:
            return None
        return k8s.core.v1.Secret(
            f"{name}-alertmanager-slack",
            metadata={"name": SLACK_SECRET, "namespace": MONITORING_NAMESPACE},
            type="Opaque",
            string_data={SLACK_SECRET_KEY: pulumi.Output.secret(args.alert_slack_webhook)},
            opts=self._in_cluster(args, self.namespace),
        )

    def _alertmanager_credentials(self, name: str, args: ObservabilityArgs) -> list[pulumi.Resource]:
        """Alertmanager's Pod Identity role: ``sns:Publish`` on the alert topic, nothing else.
        Returns what Alertmanager waits for (none without a topic)."""
        topic = args.settings.alert_sns_topic_arn
        if topic is None:
            return []
        assert args.eks is not None, "an SNS topic needs Pod Identity on a cluster of ours (settings rule)"
        _, credentials = pod_identity_role(
            f"{name}-alertmanager", cluster_name=args.eks.cluster_name,
            service_account=ALERTMANAGER_SERVICE_ACCOUNT, inline=inline_policy(["sns:Publish"], topic),
            parent=self, ready=args.ready,
        )
        return credentials

    def _cloudwatch(self, name: str, args: ObservabilityArgs) -> aws.eks.Addon:
        """Container Insights, its own DCGM exporter off (``cloudwatch_configuration``), writing
        into log groups of ours (``container_insights_log_groups``)."""
        assert args.eks is not None
        eks = args.eks
        self.container_insights_logs = [
            aws.cloudwatch.LogGroup(
                f"{name}-container-insights-{kind}",
                name=pulumi.Output.from_input(eks.cluster_name).apply(lambda cluster, k=kind: log_group(cluster, k)),
                retention_in_days=eks.log_retention_days,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for kind in CONTAINER_INSIGHTS_LOG_GROUPS
        ]
        return self._addon(
            f"{name}-cloudwatch", args, "amazon-cloudwatch-observability", CLOUDWATCH_SERVICE_ACCOUNT,
            CLOUDWATCH_POLICY,
            # After kube-prometheus-stack: its monitoring CRDs are then already in place.
            self.stack_release,
            *self.container_insights_logs,
            configuration_values=json.dumps(cloudwatch_configuration()),
            extra_actions=CLOUDWATCH_IMDS_FALLBACK,
        )
