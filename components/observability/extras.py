"""Optional extras: the CloudWatch observability add-on and an htop/nvtop DaemonSet on the GPU nodes.

``observability.cloudwatchContainerInsights`` installs the **CloudWatch** observability add-on (on
a cluster this stack creates) with its own DCGM exporter off; ``observability.debugTools`` runs the
**htop/nvtop** DaemonSet.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components import checkov, versions
from components.gpu_nodes import gpu_node_placement
from components.observability.common import MONITORING_NAMESPACE, EksAddonTarget, ObservabilityPart, eks_addon

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



def cloudwatch_configuration() -> dict[str, Any]:
    """``configuration_values`` of the amazon-cloudwatch-observability add-on.

    ``accelerated_compute_metrics: false`` is the add-on's documented opt-out of GPU metrics; the
    CloudWatch agent operator then deploys no DCGM exporter of its own (two exporters on one GPU
    would both hold DCGM's profiling module and compete for it). Container Insights keeps its
    node, pod and container metrics and the container logs.
    """
    kubernetes = {"enhanced_container_insights": True, "accelerated_compute_metrics": False}
    return {"agent": {"config": {"logs": {"metrics_collected": {"kubernetes": kubernetes}}}}}


def debug_tools_spec(gpu_instance_type: str) -> dict[str, Any]:
    """DaemonSet spec of the htop/nvtop pods: ``kubectl exec -it <pod> -- nvtop``.

    No maintained public image ships nvtop, so a pinned CUDA base image installs htop and nvtop
    from Ubuntu when the pod starts (the nodes reach the Ubuntu mirrors through the NAT gateway;
    without network the pod still starts and says so in its log). ``hostPID`` lets htop see the
    training processes; ``NVIDIA_VISIBLE_DEVICES=all`` without a GPU request lets nvtop see every
    GPU without taking one from the scheduler.
    """
    labels = {"app.kubernetes.io/name": DEBUG_TOOLS_NAME}
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
                "containers": [_debug_tools_container()],
            },
        },
    }


def _debug_tools_container() -> dict[str, Any]:
    """The one container of the debug-tools pods: installs htop and nvtop, then waits."""
    install = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "htop nvtop >/dev/null && echo 'htop and nvtop installed' "
        "|| echo 'installing htop/nvtop failed: no route to the Ubuntu mirrors?'; exec sleep infinity"
    )
    return {
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


@dataclass(frozen=True, kw_only=True)
class ObservabilityExtrasArgs:
    """Inputs of ``ObservabilityExtras``."""

    provider: k8s.Provider
    namespace: k8s.core.v1.Namespace
    stack_release: k8s.helm.v3.Release
    """kube-prometheus-stack: the CloudWatch add-on comes after its monitoring CRDs."""
    gpu_instance_type: str
    """The profile's instance type: the debug tools run on nodes of this type."""
    cloudwatch: EksAddonTarget | None = None
    """The cluster that gets the CloudWatch add-on; None: no add-on."""
    debug_tools: bool = False
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)


class ObservabilityExtras(ObservabilityPart):
    """The CloudWatch add-on and the debug tools, each when asked for."""

    def __init__(self, name: str, args: ObservabilityExtrasArgs, opts: pulumi.ResourceOptions):
        super().__init__("fsdp-eks:observability:ObservabilityExtras", f"{name}-extras", args.provider, args.ready,
                         opts)
        self.cloudwatch = self._cloudwatch(name, args) if args.cloudwatch is not None else None
        self.debug_tools, self.debug_tools_network_policy = (
            self._debug_tools(name, args) if args.debug_tools else (None, None)
        )
        self.register_outputs({})

    def _cloudwatch(self, name: str, args: ObservabilityExtrasArgs) -> aws.eks.Addon:
        """Container Insights, its own DCGM exporter off (``cloudwatch_configuration``), writing
        into log groups of ours (``CONTAINER_INSIGHTS_LOG_GROUPS``)."""
        assert args.cloudwatch is not None
        target = args.cloudwatch
        self.container_insights_logs = [
            aws.cloudwatch.LogGroup(
                f"{name}-container-insights-{kind}",
                name=pulumi.Output.from_input(target.cluster_name).apply(lambda cluster, k=kind: log_group(cluster, k)),
                retention_in_days=target.log_retention_days,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for kind in CONTAINER_INSIGHTS_LOG_GROUPS
        ]
        return eks_addon(
            self, f"{name}-cloudwatch", args.cloudwatch, "amazon-cloudwatch-observability", CLOUDWATCH_SERVICE_ACCOUNT,
            CLOUDWATCH_POLICY,
            # After kube-prometheus-stack: its monitoring CRDs are then already in place.
            args.stack_release,
            *self.container_insights_logs,
            configuration_values=json.dumps(cloudwatch_configuration()),
            extra_actions=CLOUDWATCH_IMDS_FALLBACK,
        )

    def _debug_tools(
        self, name: str, args: ObservabilityExtrasArgs
    ) -> tuple[k8s.apps.v1.DaemonSet, k8s.networking.v1.NetworkPolicy]:
        """The htop/nvtop DaemonSet, and a NetworkPolicy that admits nothing to its pods (they serve
        nothing; ``kubectl exec`` goes through the kubelet, not the pod network)."""
        spec = debug_tools_spec(args.gpu_instance_type)
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-debug-tools-network-policy",
            metadata={"name": DEBUG_TOOLS_NAME, "namespace": MONITORING_NAMESPACE},
            spec={"podSelector": {"matchLabels": spec["selector"]["matchLabels"]},
                  "policyTypes": ["Ingress"], "ingress": []},
            opts=self.in_cluster(args.namespace),
        )
        daemon_set = k8s.apps.v1.DaemonSet(
            f"{name}-debug-tools",
            metadata={"name": DEBUG_TOOLS_NAME, "namespace": MONITORING_NAMESPACE,
                      "annotations": checkov.skip_annotations(DEBUG_TOOLS_CHECKOV_SKIPS)},
            spec=spec,
            opts=self.in_cluster(args.namespace),
        )
        return daemon_set, policy
