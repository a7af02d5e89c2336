"""The monitoring stack under mocks, both stacks and the options: what Kubernetes and AWS receive.

Checked against the charts' documented values (kube-prometheus-stack 88.5.3, dcgm-exporter 4.8.2),
docs/design.md's observability facts (ServiceMonitor pick-up, dashboard label, one DCGM exporter per
GPU node), the CloudWatch agent operator's GPU opt-out, and Kubernetes' own schemas
(kubernetes-validate, strict) for the core objects.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from components import versions
from components.cluster import SYSTEM_NODE_LABEL
from components.dashboards import gpu_training
from components.observability.alert_delivery import RULES_FILE
from components.observability.common import MONITORING_NAMESPACE
from components.observability.gpu_telemetry import DCGM_COUNTERS_PATH, dcgm_exported_metrics
from components.planning.hardware import PROFILES
from components.settings import SettingsError
from offline.mocks import engine_urn
from offline.recording import is_secret_value
from tests.harness import (
    DUMMY_SECRETS,
    GPU_TAINT,
    HELM,
    POD_IDENTITY,
    Recording,
    Registration,
    installs_pin,
    plain,
    pod_identity,
    release,
    secure,
    stack_config,
    tolerates,
    trusted_by_pod_identity,
    variant,
    waits_for,
)
from tests.observability_promql import known_metrics, metric_names

ADDON = "aws:eks/addon:Addon"
PASSWORD = DUMMY_SECRETS["fsdp-eks:grafanaAdminPassword"]
TOPIC = "arn:aws:sns:us-west-2:123456789012:fsdp-eks-alerts"

CHART_DEFAULT_METRICS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
}
"""dcgm-exporter chart 4.8.2's default list (templates/metrics-configmap.yaml)."""
HEALTH_METRICS = {
    "DCGM_FI_DEV_XID_ERRORS": "gauge",  # the code of the last Xid
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "counter",
    "DCGM_FI_DEV_POWER_VIOLATION": "counter",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
}
"""What the health alerts and the dashboard need, with the Prometheus type DCGM gives each."""


# --------------------------------------------------------------------------- helpers


def kubernetes_version(stack: str) -> str:
    """The cluster's Kubernetes version, as the stack file sets it."""
    return stack_config(stack)["fsdp-eks:cluster"]["kubernetesVersion"]


@pytest.fixture(scope="module")
def options_recording() -> Recording:
    """p5 with the CloudWatch add-on and the debug tools on (one extra program run)."""
    return variant("p5", observability={"cloudwatchContainerInsights": True, "debugTools": True})


@pytest.fixture(scope="module")
def existing_recording() -> Recording:
    """p5's in-cluster layers onto a cluster created elsewhere (one extra program run)."""
    # FSx only on a cluster of ours
    return variant("p5", cluster={"existingClusterName": "shared-gpu"},
                   storage={"fsx": False, "existingClaimName": "checkpoints"})


def addons(recording: Recording, name: str) -> list[Registration]:
    return [r for r in recording.of_type(ADDON) if r.inputs["addonName"] == name]


def requires_gpu_node(affinity: dict, instance_type: str) -> bool:
    """Requires the GPU instance type: a label of our GPU nodes and of an existing cluster's alike."""
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    expected = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [instance_type]}
    return terms == [{"matchExpressions": [expected]}]


# --------------------------------------------------------------------------- both stacks


def test_charts_are_pinned(recording: Recording):
    for chart in (versions.KUBE_PROMETHEUS_STACK, versions.DCGM_EXPORTER):
        r = release(recording, chart)
        assert installs_pin(r, chart), f"{r.name}: {r.inputs['chart']} {r.inputs['version']}"
        assert r.inputs["namespace"] == MONITORING_NAMESPACE
        assert r.provider and "cluster-k8s" in r.provider, "in-cluster objects use the cluster's provider"


def test_prometheus_picks_up_every_monitor_and_rule(recording: Recording):
    """The training job's PodMonitor (another namespace, no release label) is scraped too."""
    spec = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]["prometheus"]["prometheusSpec"]
    for kind in ("serviceMonitor", "podMonitor", "rule"):
        assert spec[f"{kind}SelectorNilUsesHelmValues"] is False, kind


def test_our_monitors_and_rules_carry_the_release_label(recording: Recording):
    kps = release(recording, versions.KUBE_PROMETHEUS_STACK)
    monitor = release(recording, versions.DCGM_EXPORTER).inputs["values"]["serviceMonitor"]
    rule = recording.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert monitor["enabled"] is True
    assert monitor["additionalLabels"]["release"] == rule.inputs["metadata"]["labels"]["release"] == kps.name
    assert kps.name in rule.dependencies and kps.name in release(recording, versions.DCGM_EXPORTER).dependencies, (
        "the monitoring CRDs come with kube-prometheus-stack"
    )


def test_dcgm_exporter_only_on_gpu_nodes(recording: Recording, stack: str):
    values = release(recording, versions.DCGM_EXPORTER).inputs["values"]
    assert tolerates(values["tolerations"], GPU_TAINT)
    assert requires_gpu_node(values["affinity"], PROFILES[stack_config(stack)["fsdp-eks:profile"]].instance_type)


def test_dcgm_exporter_exports_the_health_metrics(recording: Recording):
    """Checked against the CSV the chart receives (``customMetrics``) and chart 4.8.2's default list."""
    values = release(recording, versions.DCGM_EXPORTER).inputs["values"]
    assert parse_flags_short(values["arguments"])["-f"] == DCGM_COUNTERS_PATH
    exported = dcgm_exported_metrics(values["customMetrics"])
    assert CHART_DEFAULT_METRICS <= set(exported), "customMetrics replaces the default list: keep it"
    for name, kind in HEALTH_METRICS.items():
        assert exported.get(name) == kind, f"{name} must be exported as a {kind}"


def parse_flags_short(args: list[str]) -> dict[str, str]:
    """``-x value`` pairs of dcgm-exporter's command line."""
    assert len(args) % 2 == 0 and all(a.startswith("-") for a in args[::2]), args
    return dict(zip(args[::2], args[1::2], strict=True))


def test_dcgm_exporter_reads_the_node_monitoring_agents_host_engine(recording: Recording):
    """One DCGM host engine per node (NVIDIA/DCGM #108: two are unsupported): the node monitoring
    agent's dcgm-server serves nv-hostengine on host port 5555 (its chart's
    templates/dcgm-daemonset.yaml, v1.6.2); the exporter connects with ``-r`` (chart 4.8.2 values:
    "Use -r <HOST>:<PORT> to connect to an already running hostengine") from the host network,
    where localhost is the node."""
    values = release(recording, versions.DCGM_EXPORTER).inputs["values"]
    assert parse_flags_short(values["arguments"])["-r"] == "localhost:5555"
    assert values["hostNetwork"] is True
    agents = addons(recording, "eks-node-monitoring-agent")
    assert len(agents) == 1, "the host engine comes with the agent: it must be installed"
    dcgm = release(recording, versions.DCGM_EXPORTER)
    assert agents[0].name in waits_for(recording, dcgm.name), (
        "the exporter's atomic release waits for the agent, or it crash-loops until the host engine listens")


def test_on_an_existing_cluster_dcgm_exporter_embeds_its_own_host_engine():
    """Nothing of ours installs the node monitoring agent on a cluster we did not create, so no
    host engine may listen on port 5555: the exporter embeds one (the chart's default, no ``-r``,
    not on the host network) rather than crash-looping until its release times out."""
    rec = variant("p5", cluster={"existingClusterName": "research"},
                  storage={"fsx": False, "existingClaimName": "checkpoints"})
    values = release(rec, versions.DCGM_EXPORTER).inputs["values"]
    assert "-r" not in parse_flags_short(values["arguments"])
    assert values["hostNetwork"] is False


def test_monitoring_runs_on_system_nodes_node_exporter_everywhere(recording: Recording):
    values = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]
    for path in (("prometheus", "prometheusSpec"), ("alertmanager", "alertmanagerSpec"), ("grafana",),
                 ("prometheusOperator",), ("kube-state-metrics",)):
        node = values
        for key in path:
            node = node[key]
        assert node["nodeSelector"] == SYSTEM_NODE_LABEL, ".".join(path)
    node_exporter = values["prometheus-node-exporter"]["tolerations"]
    assert tolerates(node_exporter, GPU_TAINT)
    assert tolerates(node_exporter, {"key": "dedicated", "value": "team-a", "effect": "NoSchedule"}), (
        "node-exporter belongs on every node, whatever NoSchedule taint it carries")


def test_grafana_password_only_through_a_secret(recording: Recording):
    grafana = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]["grafana"]
    [secret] = [r for r in recording.of_type("kubernetes:core/v1:Secret")
                if r.inputs["metadata"]["name"] == grafana["admin"]["existingSecret"]]
    assert secret.inputs["metadata"]["namespace"] == MONITORING_NAMESPACE
    data = secret.inputs["stringData"]
    assert is_secret_value(data), "the Secret's data is a Pulumi secret"
    assert plain(data)[grafana["admin"]["passwordKey"]] == PASSWORD
    assert plain(data)[grafana["admin"]["userKey"]]
    assert "adminPassword" not in json.dumps(grafana)
    for r in recording.of_type(HELM):
        assert PASSWORD not in json.dumps(r.inputs), f"{r.name}: password in plain Helm values"
    for key, value in recording.exports.items():
        assert PASSWORD not in json.dumps(value, default=str), f"export {key} shows the password"


def test_grafana_only_inside_the_cluster(recording: Recording):
    grafana = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]["grafana"]
    assert grafana["service"]["type"] == "ClusterIP"
    command = recording.exports["grafana_command"]
    assert command == f"kubectl -n {MONITORING_NAMESPACE} port-forward svc/{grafana['fullnameOverride']} 3000:80"


def test_dashboard_configmap_is_loaded_by_grafana(recording: Recording):
    sidecar = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]["grafana"]["sidecar"]["dashboards"]
    [dashboard] = [r for r in recording.of_type("kubernetes:core/v1:ConfigMap")
                   if r.inputs["metadata"].get("labels", {}).get("grafana_dashboard") is not None]
    labels = dashboard.inputs["metadata"]["labels"]
    assert labels == {"grafana_dashboard": "1"}
    assert sidecar["enabled"] is True and labels[sidecar["label"]] == sidecar["labelValue"]
    [content] = dashboard.inputs["data"].values()
    # What Grafana gets reads only what is exported: by the exporter with the metrics list the
    # dcgm-exporter release is given, by the training package, by Prometheus and kube-state-metrics.
    known = known_metrics(release(recording, versions.DCGM_EXPORTER).inputs["values"]["customMetrics"])
    queries = gpu_training.queries(json.loads(content))
    assert len(queries) > 15
    for title, expr in queries:
        assert metric_names(expr) and metric_names(expr) <= set(known), f"{title}: {expr}"


def test_alert_rules_are_the_tested_file(recording: Recording):
    """Checked against the file promtool checks (tests/test_alert_rules.py), parsed here."""
    rule = recording.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.inputs["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule.inputs["spec"] == yaml.safe_load(RULES_FILE.read_text())
    assert rule.inputs["spec"]["groups"], "no rule group"


def test_prometheus_storage_and_retention(recording: Recording, stack: str):
    wanted = stack_config(stack)["fsdp-eks:observability"]
    spec = release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]["prometheus"]["prometheusSpec"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    [storage_class] = [r for r in recording.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
                       if r.inputs["metadata"]["name"] == claim["storageClassName"]]
    assert storage_class.inputs["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.inputs["parameters"]["type"] == "gp3"
    assert storage_class.inputs["reclaimPolicy"] == "Delete", "the EBS volume goes with its claim"
    assert claim["resources"]["requests"]["storage"] == f"{wanted['prometheusStorageGiB']}Gi"
    assert spec["retention"] == wanted["prometheusRetention"]
    assert int(spec["retentionSize"].removesuffix("GB")) < wanted["prometheusStorageGiB"], "stop before the disk is full"
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain", (
        "the claim is the stack's own: the StatefulSet must not garbage-collect it"
    )


def test_ebs_csi_driver_addon_with_pod_identity(recording: Recording, stack: str):
    [addon] = addons(recording, "aws-ebs-csi-driver")
    assert addon.inputs["addonVersion"] == versions.EKS_ADDONS[kubernetes_version(stack)]["aws-ebs-csi-driver"]
    assoc, role, policy = pod_identity(recording, "kube-system", "ebs-csi-controller-sa")
    assert trusted_by_pod_identity(role)
    assert policy == "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
    assert assoc.name in addon.dependencies, "credentials exist before the controller starts"


def test_destroy_removes_the_release_before_the_storage_driver(recording: Recording):
    """Destroy runs dependencies in reverse: the release (and its volume) before the class and driver."""
    kps = release(recording, versions.KUBE_PROMETHEUS_STACK)
    [addon] = addons(recording, "aws-ebs-csi-driver")
    [storage_class] = recording.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert {addon.name, storage_class.name} <= set(kps.dependencies)
    assert addon.name in storage_class.dependencies


def test_options_are_off_by_default(recording: Recording):
    assert addons(recording, "amazon-cloudwatch-observability") == []
    names = [r.inputs["metadata"]["name"] for r in recording.of_type("kubernetes:apps/v1:DaemonSet")]
    assert "gpu-debug-tools" not in names


def test_core_objects_are_valid_kubernetes(recording: Recording, stack: str):
    kinds = ("Namespace", "Secret", "ConfigMap", "StorageClass", "DaemonSet")
    ours = [r for r in recording.resources if r.name.startswith("observability-") and r.inputs.get("kind") in kinds]
    assert {r.inputs["kind"] for r in ours} >= {"Namespace", "Secret", "ConfigMap", "StorageClass"}
    for r in ours:
        kubernetes_validate.validate(plain(r.inputs), kubernetes_version(stack), strict=True)


# --------------------------------------------------------------------------- options and variants


def test_cloudwatch_addon_never_adds_a_second_dcgm_exporter(options_recording: Recording):
    [addon] = addons(options_recording, "amazon-cloudwatch-observability")
    pinned = versions.EKS_ADDONS[kubernetes_version("p5")]["amazon-cloudwatch-observability"]
    assert addon.inputs["addonVersion"] == pinned
    k8s = json.loads(addon.inputs["configurationValues"])["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    assert k8s["accelerated_compute_metrics"] is False, "the add-on's own DCGM exporter stays off"
    assert k8s["enhanced_container_insights"] is True
    release(options_recording, versions.DCGM_EXPORTER)  # still exactly one of ours
    _, role, policy = pod_identity(options_recording, "amazon-cloudwatch", "cloudwatch-agent")
    assert trusted_by_pod_identity(role)
    assert policy == "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"


def test_debug_tools_daemonset(options_recording: Recording):
    [ds] = [r for r in options_recording.of_type("kubernetes:apps/v1:DaemonSet")
            if r.inputs["metadata"]["name"] == "gpu-debug-tools"]
    pod = ds.inputs["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == versions.DEBUG_TOOLS_IMAGE and ":latest" not in container["image"]
    assert tolerates(pod["tolerations"], GPU_TAINT) and requires_gpu_node(pod["affinity"], "p5.48xlarge")
    assert pod["hostPID"] is True, "htop sees the training processes"
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {})), "takes no GPU from the job"
    assert container["command"][-1].endswith("exec sleep infinity")
    kubernetes_validate.validate(plain(ds.inputs), kubernetes_version("p5"), strict=True)


def test_existing_cluster_gets_no_aws_resources_but_the_same_monitoring(existing_recording: Recording):
    assert addons(existing_recording, "aws-ebs-csi-driver") == [], "an existing cluster brings its EBS CSI driver"
    assert [r for r in existing_recording.of_type(POD_IDENTITY)] == []
    release(existing_recording, versions.KUBE_PROMETHEUS_STACK)
    release(existing_recording, versions.DCGM_EXPORTER)
    assert existing_recording.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert "grafana_command" in existing_recording.exports
    values = release(existing_recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"]
    assert values["prometheus"]["prometheusSpec"]["nodeSelector"] == {}, (
        "an existing cluster's nodes lack our system label: Prometheus would never schedule")


def test_cloudwatch_on_an_existing_cluster_is_refused():
    with pytest.raises(SettingsError, match="observability.cloudwatchContainerInsights"):
        variant("p5", observability={"cloudwatchContainerInsights": True}, cluster={"existingClusterName": "shared-gpu"})


def test_observability_off_creates_nothing_and_needs_no_password():
    recording = variant("p5", drop=("grafanaAdminPassword",), observability={"enabled": False})
    assert [r for r in recording.resources if r.name.startswith("observability")] == []
    assert "grafana_command" not in recording.exports


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"prometheusRetention": "15 days"}, "observability.prometheusRetention"),
        ({"prometheusRetention": "0d"}, "observability.prometheusRetention"),
        ({"prometheusStorageGiB": 5}, "observability.prometheusStorageGiB"),
    ],
)
def test_bad_monitoring_settings_are_named(changes: dict, key: str):
    with pytest.raises(SettingsError, match=key):
        variant("p5", observability=changes)


# --------------------------------------------------------------------------- an existing stack

RESOURCE_URNS = Path(__file__).parents[1] / "fixtures" / "observability" / "resource_urns.txt"
"""Every resource of Observability, p5 with every option on, as a run recorded them before
Observability was split into its parts."""


def urns_in_state(recording: Recording) -> set[str]:
    """Every URN a stack's state may know a resource of this run by: its URN, its aliases, and
    (as the engine derives them) its URN under each URN its parent may be known by."""
    by_urn = {r.urn: r for r in recording.resources}

    @functools.cache
    def known(urn: str) -> frozenset[str]:
        r = by_urn.get(urn)
        if r is None:  # the stack itself
            return frozenset({urn})
        stack = r.urn.split("::")[0].removeprefix("urn:pulumi:")
        inherited = {engine_urn(parent, r.type, r.name, stack) for parent in known(r.parent)} if r.parent else set()
        return frozenset({r.urn, *r.aliases, *inherited})

    return set().union(*(known(urn) for urn in by_urn))


def test_an_existing_stack_keeps_every_observability_resource():
    """``pulumi up`` on a stack deployed before the split replaces nothing: each recorded URN is
    the URN or an alias of a resource registered now."""
    stack_urn = "urn:pulumi:p5-variant::fsdp-eks::"
    recording = variant(
        "p5", observability={"cloudwatchContainerInsights": True, "debugTools": True, "alertSnsTopicArn": TOPIC},
        alertSlackWebhook=secure("https://hooks.slack.com/services/T000/B000/XXXX"))
    before = [line for line in RESOURCE_URNS.read_text().splitlines() if line and not line.startswith("#")]
    assert len(before) > 20
    known = urns_in_state(recording)
    assert [urn for urn in before if stack_urn + urn not in known] == []
