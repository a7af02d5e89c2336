"""Kubeflow Training Operator v1 (PyTorchJob ``kubeflow.org/v1``), standalone overlay, pinned.

Applied with server-side apply through the cluster's provider (``enable_server_side_apply``):
the v1.9 PyTorchJob CRD is about 293 kB as JSON, over the 262 kB annotation that client-side
apply writes, so a client-side apply of it fails. The kustomization is fetched by kustomize's
own git loader at preview and update (``git`` must be on the PATH of the machine running Pulumi).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import versions


@dataclass(frozen=True, kw_only=True)
class TrainingOperatorArgs:
    """Inputs of ``TrainingOperator``."""

    provider: k8s.Provider
    """The cluster's provider; it must have server-side apply enabled."""
    manifests: str = versions.TRAINING_OPERATOR_MANIFESTS
    ready: Sequence[pulumi.Resource] = ()
    """What the operator waits for: the nodes and cluster DNS its pods need (the cluster's ``ready``)."""


class TrainingOperator(pulumi.ComponentResource):
    """The operator's CRDs, RBAC, webhook and Deployment, in namespace ``kubeflow``."""

    def __init__(self, name: str, args: TrainingOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:operator:TrainingOperator", name, None, opts)
        self.manifests = k8s.kustomize.v2.Directory(
            f"{name}-standalone",
            directory=args.manifests,
            # Children wait for readiness (skip_await False): the job is created only once the
            # CRD is established and the operator's webhook answers.
            skip_await=False,
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.ready)),
        )
        self.register_outputs({"manifests": args.manifests})
