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
from components.gpu_nodes import GPU_LABELS, GPU_TOLERATION, gpu_node_placement
from components.helm import helm_release


def nvidia_plugin_values() -> dict:
    """On GPU nodes only, tolerating their taint."""
    return gpu_node_placement()


def efa_plugin_values() -> dict:
    """On EFA nodes only: on a node without EFA devices the plugin crash-loops.

    The chart already requires an EFA-capable instance type (its ``supportedInstanceLabels``
    affinity); the node selector narrows that to our GPU group, the toleration lets it in.
    """
    return {
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"vpc.amazonaws.com/efa.present": GPU_LABELS["vpc.amazonaws.com/efa.present"]},
    }


@dataclass(frozen=True, kw_only=True)
class DevicePluginsArgs:
    """Inputs of ``DevicePlugins``."""

    provider: k8s.Provider
    ready: Sequence[pulumi.Resource] = ()
    """What the plugins wait for: the GPU nodes they run on (and the cluster's ``ready``)."""


class DevicePlugins(pulumi.ComponentResource):
    """The two device plugins as pinned Helm releases in kube-system."""

    def __init__(self, name: str, args: DevicePluginsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:plugins:DevicePlugins", name, None, opts)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.ready))
        self.nvidia = helm_release(
            f"{name}-nvidia", versions.NVIDIA_DEVICE_PLUGIN, "kube-system", nvidia_plugin_values(), in_cluster
        )
        self.efa = helm_release(
            f"{name}-efa", versions.EFA_DEVICE_PLUGIN, "kube-system", efa_plugin_values(), in_cluster
        )
        self.register_outputs({"nvidia_release": self.nvidia.name, "efa_release": self.efa.name})
