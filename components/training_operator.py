"""Kubeflow Training Operator v1 (PyTorchJob ``kubeflow.org/v1``), vendored kustomize overlay, pinned.

Applied with server-side apply through the cluster's provider (``enable_server_side_apply``):
the v1.9 PyTorchJob CRD is about 293 kB as JSON, over the 262 kB annotation that client-side
apply writes, so a client-side apply of it fails. The manifests are vendored in
``vendor/kustomize/`` (the v1.9.4 tag of kubeflow/trainer): kustomize builds them from the
repository at preview and update, with no git or network, exactly as the tests render them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components import versions


def operator_overlay(system_node_selector: Mapping[str, str]) -> str:
    """The kustomization to apply: the operator on the system nodes when the cluster has them
    (``training-operator-system-nodes``, whose patch sets that label), else the upstream
    standalone overlay (an existing cluster: its nodes lack our label)."""
    return str(versions.TRAINING_OPERATOR_OVERLAYS["system-nodes" if system_node_selector else "standalone"])


@dataclass(frozen=True, kw_only=True)
class TrainingOperatorArgs:
    """Inputs of ``TrainingOperator``."""

    provider: k8s.Provider
    """The cluster's provider; it must have server-side apply enabled."""
    system_node_selector: Mapping[str, str] = field(default_factory=dict)
    """The cluster's system node label (empty on an existing cluster)."""
    ready: Sequence[pulumi.Resource] = ()
    """What the operator waits for: the nodes and cluster DNS its pods need (the cluster's ``ready``)."""


class TrainingOperator(pulumi.ComponentResource):
    """The operator's CRDs, RBAC, webhook and Deployment, in namespace ``kubeflow``."""

    def __init__(self, name: str, args: TrainingOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:operator:TrainingOperator", name, None, opts)
        directory = operator_overlay(args.system_node_selector)
        self.manifests = k8s.kustomize.v2.Directory(
            f"{name}-standalone",
            # Relative to the project root, where `pulumi up` runs: the same on every machine.
            directory=directory,
            # Children wait for readiness (skip_await False): the job is created only once the
            # CRD is established and the operator's webhook answers.
            skip_await=False,
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.ready)),
        )
        self.register_outputs({"manifests": directory})
