"""What the parts of ``Observability`` share: the namespace, the chart's object names, the EKS
add-on target, and the base of each part (its children keep the URNs they had before the split)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components import versions
from components.cluster import ADDON_CONFLICT_RESOLUTION
from components.pod_identity import inline_policy, pod_identity_role
from components.settings import MONITORING_NAMESPACE  # noqa: F401  (re-exported: the parts read it from here)

KPS_FULLNAME = "kps"
"""``fullnameOverride`` of kube-prometheus-stack: object names do not depend on the release name."""


@dataclass(frozen=True, kw_only=True)
class EksAddonTarget:
    """The EKS cluster this stack creates, which gets the EBS CSI (and CloudWatch) add-ons."""

    cluster_name: pulumi.Input[str]
    kubernetes_version: str
    """Picks the add-on versions in ``versions.EKS_ADDONS``."""
    log_retention_days: int
    """Retention of the log groups the CloudWatch add-on writes to (``cluster.logRetentionDays``)."""


class ObservabilityPart(pulumi.ComponentResource):
    """One concern of ``Observability``, its child (``opts.parent``).

    The resources of every part were children of ``Observability`` itself before it was split
    into parts; each carries an alias to that parent (``moved``), so a stack deployed before
    keeps them instead of replacing them (tests/infra/test_observability.py checks every URN).
    """

    def __init__(self, type_: str, name: str, provider: k8s.Provider, ready: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions):
        super().__init__(type_, name, None, opts)
        self.provider = provider
        self.ready = list(ready)
        """What must exist first: the Pod Identity agent and the system nodes everything runs on."""
        self.moved = [pulumi.Alias(parent=opts.parent)]

    def in_cluster(self, *after: pulumi.Resource) -> pulumi.ResourceOptions:
        """Options of a Kubernetes child: the cluster's provider, after ``ready`` and ``after``."""
        return pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[*self.ready, *after],
                                      aliases=self.moved)


def eks_addon(
    part: ObservabilityPart, resource_name: str, target: EksAddonTarget, addon_name: str,
    service_account: tuple[str, str], policy_arn: str, *after: pulumi.Resource,
    configuration_values: str | None = None, extra_actions: list[str] | None = None,
) -> aws.eks.Addon:
    """A pinned EKS add-on of ``part`` whose service account gets ``policy_arn`` (and
    ``extra_actions``, inline) through Pod Identity (the association exists first, so its pods
    start with credentials)."""
    _, first = pod_identity_role(
        resource_name, cluster_name=target.cluster_name, service_account=service_account,
        policy_arn=policy_arn, inline=inline_policy(extra_actions) if extra_actions else None,
        parent=part, ready=part.ready, aliases=part.moved,
    )
    return aws.eks.Addon(
        resource_name,
        cluster_name=target.cluster_name,
        addon_name=addon_name,
        addon_version=versions.EKS_ADDONS[target.kubernetes_version][addon_name],
        resolve_conflicts_on_create=ADDON_CONFLICT_RESOLUTION,
        resolve_conflicts_on_update=ADDON_CONFLICT_RESOLUTION,
        configuration_values=configuration_values,
        opts=pulumi.ResourceOptions(parent=part, depends_on=[*first, *part.ready, *after], aliases=part.moved),
    )
