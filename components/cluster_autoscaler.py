"""The Kubernetes Cluster Autoscaler for the GPU node group: nodes leave a set time after the
last GPU pod ends and come back when GPU pods are pending.

Why this autoscaler and not Karpenter (docs/design.md#gpu-nodes-scale-to-zero): the GPU nodes
come from our own launch template (one interface per network card, 32 EFA on p5), on an
On-Demand Capacity Reservation or a capacity block, through a managed node group; the Cluster
Autoscaler only changes that group's desired size, so all of it stays as built.

Scale from zero: with no GPU node to copy, the autoscaler builds a template node from the
Auto Scaling group (AWS provider, ``cloudprovider/aws/aws_manager.go``
``buildNodeFromTemplate``): CPU, memory and GPUs from the instance type, and labels, taints and
other resources only from ``k8s.io/cluster-autoscaler/node-template/...`` tags on the group.
EKS copies neither the node group's labels nor its taints to those tags, and its
DescribeNodegroup fallback serves only a group that never had a node (the provider's README),
so ``GpuNodeGroup`` tags the group itself (``node_template_tags``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import versions
from components.helm import helm_release
from components.pod_identity import pod_identity_role

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"
"""Fixed (``rbac.serviceAccount.name``): the Pod Identity association names it."""
DISCOVERY_TAG = "fsdp-eks/gpu-autoscaling"
"""Our tag on the GPU group's Auto Scaling group, valued with the cluster's name: the autoscaler
discovers only groups that carry it (not the system nodes' group, which Pulumi sizes), and its
policy may change only those."""
QUARANTINE_TAINT_KEY = "fsdp-eks/quarantine"
"""The taint that takes a GPU node out of the job (``NoExecute``, the reason as its value; the
alert ``GpuNodeQuarantined`` names both). The autoscaler removes the emptied node after the
scale-down delay and, told that the taint is a node's status and not its group's
(``--status-taint``), still builds new nodes of the group without it: otherwise, copying a
quarantined node as its template, it would never add the replacement (``status-taint`` in
``config/flags/flags.go``: "ignore in node templates ... nodes will not be treated as unready")."""
TEMPLATE_PREFIX = "k8s.io/cluster-autoscaler/node-template"
"""Prefix of the Auto Scaling group tags the autoscaler reads a template node from."""


def node_template_tags(labels: dict[str, str], taints: Sequence[dict[str, str]],
                       resources: dict[str, int]) -> dict[str, str]:
    """The Auto Scaling group tags that describe a node of the group to the autoscaler when the
    group is at zero: each label, each taint as ``value:Effect``, each extended resource (the
    provider's README, "Auto-Discovery Setup"; ``extractLabelsFromAsg``, ``extractTaintsFromAsg``,
    ``extractAllocatableResourcesFromAsg``)."""
    tags = {f"{TEMPLATE_PREFIX}/label/{key}": value for key, value in labels.items()}
    tags |= {f"{TEMPLATE_PREFIX}/taint/{t['key']}": f"{t['value']}:{t['effect']}" for t in taints}
    tags |= {f"{TEMPLATE_PREFIX}/resources/{name}": str(count) for name, count in resources.items()}
    return tags


def autoscaler_policy(cluster_name: str) -> dict:
    """The autoscaler's IAM policy: the reads its AWS provider makes, on every resource (these
    Describe and Get calls support no resource-level scoping), and the two writes it makes, only
    on Auto Scaling groups that carry ``DISCOVERY_TAG`` with this cluster's name (the provider's
    README, "Full Cluster Autoscaler Features Policy", scoped "using tag based conditionals";
    the group's tag is the condition key ``autoscaling:ResourceTag/<key>``: EC2 Auto Scaling user
    guide, "Tags for security", tag-security.html)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadGroupsAndInstanceTypes",
                "Effect": "Allow",
                "Action": sorted([
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                    "eks:DescribeNodegroup",
                ]),
                "Resource": "*",
            },
            {
                "Sid": "ScaleOnlyThisClustersGpuGroup",
                "Effect": "Allow",
                "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                "Resource": "*",
                "Condition": {"StringEquals": {f"autoscaling:ResourceTag/{DISCOVERY_TAG}": cluster_name}},
            },
        ],
    }


def autoscaler_values(*, cluster_name: str, region: str, kubernetes_version: str,
                      scale_down_delay_minutes: int, system_node_selector: dict[str, str]) -> dict:
    """Chart values: discover the GPU group by its tags, remove a node ``scale_down_delay_minutes``
    after it became unneeded (no pod but DaemonSets' on it), run on the system nodes as a
    non-root, read-only container, with the image of the cluster's minor."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "fullnameOverride": "cluster-autoscaler",
        "autoDiscovery": {
            "clusterName": cluster_name,
            # EKS tags every managed group's ASG with the first two; ours narrows it to the GPU group.
            "tags": ["k8s.io/cluster-autoscaler/enabled", f"k8s.io/cluster-autoscaler/{cluster_name}",
                     f"{DISCOVERY_TAG}={cluster_name}"],
        },
        "extraArgs": {
            "scale-down-unneeded-time": f"{scale_down_delay_minutes}m",
            "status-taint": QUARANTINE_TAINT_KEY,
            # One group: "least-waste" and "random" pick the same; the default logs every choice.
            "expander": "least-waste",
        },
        "image": {"repository": versions.CLUSTER_AUTOSCALER_IMAGE,
                  "tag": versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[kubernetes_version]},
        "rbac": {"serviceAccount": {"name": SERVICE_ACCOUNT}},
        "nodeSelector": dict(system_node_selector),
        "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containerSecurityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                     "capabilities": {"drop": ["ALL"]}},
    }


@dataclass(frozen=True, kw_only=True)
class ClusterAutoscalerArgs:
    """Inputs of ``ClusterAutoscaler``."""

    cluster_name: str
    region: str
    kubernetes_version: str
    """Picks the image (``versions.CLUSTER_AUTOSCALER_IMAGE_TAGS``)."""
    scale_down_delay_minutes: int
    provider: k8s.Provider
    system_node_selector: dict[str, str]
    ready: Sequence[pulumi.Resource] = ()
    """What it waits for: the system nodes and the Pod Identity agent (``cluster.ready``) and the
    GPU group's discovery tag (without it the autoscaler finds no group)."""


class ClusterAutoscaler(pulumi.ComponentResource):
    """The autoscaler's Pod Identity role and its Helm release on the system nodes."""

    def __init__(self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:gpu:ClusterAutoscaler", name, None, opts)
        self.role, credentials = pod_identity_role(
            f"{name}-cluster-autoscaler", cluster_name=args.cluster_name, service_account=(NAMESPACE, SERVICE_ACCOUNT),
            inline=json.dumps(autoscaler_policy(args.cluster_name)), parent=self, ready=list(args.ready),
        )
        self.release = helm_release(
            f"{name}-cluster-autoscaler", versions.CLUSTER_AUTOSCALER, NAMESPACE,
            autoscaler_values(cluster_name=args.cluster_name, region=args.region,
                              kubernetes_version=args.kubernetes_version,
                              scale_down_delay_minutes=args.scale_down_delay_minutes,
                              system_node_selector=args.system_node_selector),
            pulumi.ResourceOptions(parent=self, provider=args.provider,
                                   depends_on=[*args.ready, *credentials]),
        )
        self.register_outputs({"role_arn": self.role.arn, "release": self.release.name})
