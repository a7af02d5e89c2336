"""AWS permissions for one Kubernetes service account through EKS Pod Identity.

The cluster runs the ``eks-pod-identity-agent`` add-on (components/cluster.py); a role trusted by
``pods.eks.amazonaws.com`` and a ``PodIdentityAssociation`` for ``(namespace, service account)``
hand the role's credentials to that account's pods. The association must exist before the pods
start (they read credentials once), so whatever runs as that account waits for what this returns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

POD_IDENTITY_TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
            }
        ],
    }
)
"""Trust policy of a role that EKS Pod Identity hands to a service account."""


def inline_policy(actions: Sequence[str], resource: pulumi.Input[str] = "*") -> pulumi.Output[str]:
    """A policy document allowing ``actions`` on ``resource`` only."""
    return pulumi.Output.from_input(resource).apply(lambda r: json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": sorted(actions), "Resource": r}],
    }))


def pod_identity_role(
    name: str,
    *,
    cluster_name: pulumi.Input[str],
    service_account: tuple[str, str],
    policy_arn: str | None = None,
    inline: pulumi.Input[str] | None = None,
    parent: pulumi.Resource,
    ready: Sequence[pulumi.Resource] = (),
    aliases: Sequence[pulumi.Alias] = (),
) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
    """A role for ``(namespace, service account)`` with a managed policy, an inline policy
    (``inline_policy``), or both: the least each workload needs.

    Returns the role and what the workload using the account must wait for (the policies and the
    association). ``ready``: what the association waits for (the Pod Identity agent); ``aliases``:
    what the role and the association were known by (the policies follow their role). Children are
    named ``<name>-role``, ``<name>-policy`` (managed), ``<name>-inline``, ``<name>-pod-identity``.
    """
    if policy_arn is None and inline is None:
        raise ValueError(f"{name}: a Pod Identity role without a policy grants nothing; create none")
    role = aws.iam.Role(f"{name}-role", assume_role_policy=POD_IDENTITY_TRUST,
                        opts=pulumi.ResourceOptions(parent=parent, aliases=list(aliases)))
    policies: list[pulumi.Resource] = []
    if policy_arn is not None:
        policies.append(aws.iam.RolePolicyAttachment(
            f"{name}-policy", role=role.name, policy_arn=policy_arn, opts=pulumi.ResourceOptions(parent=role)
        ))
    if inline is not None:
        policies.append(aws.iam.RolePolicy(
            f"{name}-inline", role=role.name, policy=inline, opts=pulumi.ResourceOptions(parent=role)
        ))
    namespace, account = service_account
    association = aws.eks.PodIdentityAssociation(
        f"{name}-pod-identity",
        cluster_name=cluster_name,
        namespace=namespace,
        service_account=account,
        role_arn=role.arn,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(ready), aliases=list(aliases)),
    )
    return role, [*policies, association]
