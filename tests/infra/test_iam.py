"""Every IAM policy of every role the program creates, with the reason it is needed.

Checked against this table, which is the least that works: a policy attached to any
role that is not listed here, or a listed one that is missing, fails -- for every stack file and for a
variant with every optional AWS-calling part on (CloudWatch add-on, SNS alerts). Inline policies
are compared by their statements (actions and resources).
"""

from __future__ import annotations

import json

import pytest

from tests.harness import Recording, variant

TOPIC = "arn:aws:sns:us-west-2:111122223333:gpu-alerts"

MANAGED = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
INLINE = "aws:iam/rolePolicy:RolePolicy"
ROLE = "aws:iam/role:Role"


def inline(actions: list[str], resource: str) -> str:
    return f"inline: {' '.join(sorted(actions))} on {resource}"


EXPECTED: dict[str, dict[str, str]] = {
    "cluster-node-role": {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy": "kubelet: join the cluster, describe its instance",
        "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy": "aws-node (host network) assigns pod IPs and ENIs",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly": "pull the training and add-on images",
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore": "Session Manager instead of SSH to debug a node",
    },
    "gpu-autoscaling-cluster-autoscaler-role": {
        inline(["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
                "ec2:DescribeImages", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplateVersions",
                "ec2:GetInstanceTypesFromInstanceRequirements", "eks:DescribeNodegroup"], "*"):
            "Cluster Autoscaler's reads (no resource-level scoping for them): groups, instance types, node groups",
        inline(["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"], "*"):
            "Cluster Autoscaler scales the GPU group: only groups tagged with this cluster's name "
            "(condition checked in tests/infra/test_lifecycle_autoscaling.py)",
    },
    "observability-ebs-csi-role": {
        "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy":
            "EBS CSI controller (Pod Identity): create, attach, delete Prometheus' gp3 volume",
    },
    "observability-cloudwatch-role": {
        "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy": "CloudWatch agent: put metrics and logs",
        inline(["ec2:DescribeInstances"], "*"):
            "the agent's way to its instance without IMDS (hop limit 1; amazon-cloudwatch-agent#1139)",
    },
    "observability-alertmanager-role": {
        inline(["sns:Publish"], TOPIC): "Alertmanager's SNS receiver, that topic only",
    },
}
"""Role (logical name) -> policy -> why. Roles absent from a run (options off) are not expected there."""
OPTIONAL_ROLES = {"observability-cloudwatch-role", "observability-alertmanager-role"}


def attached(recording: Recording) -> dict[str, set[str]]:
    """Role -> every policy attached to it, managed by ARN, inline as ``inline(...)``."""
    found: dict[str, set[str]] = {r.name: set() for r in recording.of_type(ROLE)}
    for r in recording.of_type(MANAGED):
        found[r.inputs["role"]].add(r.inputs["policyArn"])
    for r in recording.of_type(INLINE):
        for statement in json.loads(r.inputs["policy"])["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            found[r.inputs["role"]].add(inline(actions, statement["Resource"]))
    return found


@pytest.fixture(scope="module")
def everything_on() -> Recording:
    return variant("p5", observability={"cloudwatchContainerInsights": True, "alertSnsTopicArn": TOPIC})


def check(recording: Recording, optional_present: set[str]) -> None:
    found = attached(recording)
    expected = {role: set(policies) for role, policies in EXPECTED.items()
                if role not in OPTIONAL_ROLES or role in optional_present}
    unexplained = {role: policies - expected.get(role, set()) for role, policies in found.items()}
    assert not any(unexplained.values()), f"policies without a reason in EXPECTED: {unexplained}"
    missing = {role: policies - found.get(role, set()) for role, policies in expected.items()}
    assert not any(missing.values()), f"policies the stack no longer attaches: {missing}"


def test_every_policy_of_every_role_has_its_reason(recording: Recording):
    check(recording, optional_present=set())


def test_with_every_option_on_every_policy_still_has_its_reason(everything_on: Recording):
    check(everything_on, optional_present=OPTIONAL_ROLES)


def test_every_reason_is_stated():
    assert all(len(reason) > 20 for policies in EXPECTED.values() for reason in policies.values())
