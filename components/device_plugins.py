"""NVIDIA and EFA device plugins: what turns GPUs and EFA interfaces into schedulable resources.

The AL2023 NVIDIA AMI has the driver, container toolkit and host EFA pieces but not these
plugins; without them a node advertises neither ``nvidia.com/gpu`` nor ``vpc.amazonaws.com/efa``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import versions
from components.gpu_nodes import GPU_TOLERATION, INSTANCE_TYPE_LABEL, gpu_node_placement
from components.helm import helm_release

EFA_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"
"""The plugin's repository in the regional EKS registry (``versions.eks_image_registry``)."""


def nvidia_plugin_values(*, gpu_instance_type: str) -> dict:
    """On GPU nodes only (by instance type: ours and an existing cluster's), tolerating their taint."""
    return gpu_node_placement(gpu_instance_type)


def efa_plugin_values(*, gpu_instance_type: str, region: str) -> dict:
    """On the GPU nodes only: on a node without EFA devices the plugin crash-loops.

    The chart already requires an EFA-capable instance type (its ``supportedInstanceLabels``
    affinity); the node selector narrows that to the profile's instance type, which an existing
    cluster's GPU nodes carry too; the toleration lets it in. The image is a current plugin from
    the stack's own region (the chart's default is v0.5.10 from us-west-2).
    """
    return {
        "tolerations": [dict(GPU_TOLERATION)],
        "nodeSelector": {INSTANCE_TYPE_LABEL: gpu_instance_type},
        "image": {
            "repository": f"{versions.eks_image_registry(region)}/{EFA_PLUGIN_REPOSITORY}",
            "tag": versions.EFA_DEVICE_PLUGIN_IMAGE_TAG,
        },
    }


@dataclass(frozen=True, kw_only=True)
class DevicePluginsArgs:
    """Inputs of ``DevicePlugins``."""

    provider: k8s.Provider
    gpu_instance_type: str
    """The profile's instance type: the plugins run on nodes of this type."""
    region: str
    """The stack's region: the EFA plugin image comes from its registry."""
    ready: Sequence[pulumi.Resource] = ()
    """What the plugins wait for: the GPU nodes they run on (and the cluster's ``ready``)."""


class DevicePlugins(pulumi.ComponentResource):
    """The two device plugins as pinned Helm releases in kube-system."""

    def __init__(self, name: str, args: DevicePluginsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:plugins:DevicePlugins", name, None, opts)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.ready))
        self.nvidia = helm_release(
            f"{name}-nvidia", versions.NVIDIA_DEVICE_PLUGIN, "kube-system",
            nvidia_plugin_values(gpu_instance_type=args.gpu_instance_type), in_cluster,
        )
        self.efa = helm_release(
            f"{name}-efa", versions.EFA_DEVICE_PLUGIN, "kube-system",
            efa_plugin_values(gpu_instance_type=args.gpu_instance_type, region=args.region), in_cluster,
        )
        self.register_outputs({"nvidia_release": self.nvidia.name, "efa_release": self.efa.name})
