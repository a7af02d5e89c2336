"""The network and the cluster: VPC and subnets, Kubernetes version, system nodes, who reaches the API."""

from __future__ import annotations

import ipaddress
import re

from components import versions
from components.settings import MAX_AVAILABILITY_ZONES, NetworkSettings, Problem, Settings


def network_rules(s: Settings) -> list[Problem]:
    if not s.creates_cluster:
        return []
    n = s.network
    vpc = _new_vpc_problems(n) if n.existing_vpc_id is None else _existing_vpc_problems(n)
    return vpc + _subnet_id_problems(n)


def _new_vpc_problems(n: NetworkSettings) -> list[Problem]:
    """The CIDR and the AZs of the VPC the stack creates."""
    problems = []
    try:
        net = ipaddress.IPv4Network(n.vpc_cidr)
        if net.prefixlen > 20:
            problems.append(
                Problem("network.vpcCidr", n.vpc_cidr, "use a /20 or larger block (e.g. 10.0.0.0/16): "
                        "pods take VPC IPs")
            )
        if net.prefixlen < 16:
            problems.append(Problem("network.vpcCidr", n.vpc_cidr, "use a /16 to /20 block: a VPC's CIDR is "
                                    "at most a /16 (EC2 CreateVpc), e.g. 10.0.0.0/16"))
    except ValueError:
        problems.append(Problem("network.vpcCidr", n.vpc_cidr, "give an IPv4 CIDR such as 10.0.0.0/16"))
    azs = n.availability_zones
    if len(set(azs)) < 2:
        problems.append(
            Problem("network.availabilityZones", list(azs),
                    "list at least two AZs of the region (EKS requires subnets in two AZs)")
        )
    problems += [Problem("network.availabilityZones", az, "listed twice: list each AZ once")
                 for az in sorted({az for az in azs if azs.count(az) > 1})]
    if len(azs) > MAX_AVAILABILITY_ZONES:
        problems.append(Problem("network.availabilityZones", list(azs),
                                f"list at most {MAX_AVAILABILITY_ZONES} AZs (the subnet plan of "
                                "components/network.py): the GPU AZ and a few others are enough"))
    return problems


def _existing_vpc_problems(n: NetworkSettings) -> list[Problem]:
    """The id of an existing VPC and the subnets the nodes need in it."""
    problems = []
    if not VPC_ID.fullmatch(n.existing_vpc_id):
        problems.append(Problem("network.existingVpcId", n.existing_vpc_id,
                                "give the VPC's id: vpc- and 8 or 17 hex digits (aws ec2 describe-vpcs)"))
    for key, ids in (
        ("network.existingPrivateSubnetIds", n.existing_private_subnet_ids),
        ("network.existingGpuSubnetIds", n.existing_gpu_subnet_ids),
    ):
        if not ids:
            problems.append(Problem(key, [], "with network.existingVpcId, list the subnet ids"))
    return problems


def _subnet_id_problems(n: NetworkSettings) -> list[Problem]:
    """Subnet ids given: well formed, and only with the VPC they belong to."""
    problems = []
    subnets = (("network.existingPrivateSubnetIds", n.existing_private_subnet_ids),
               ("network.existingPublicSubnetIds", n.existing_public_subnet_ids),
               ("network.existingGpuSubnetIds", n.existing_gpu_subnet_ids))
    for key, ids in subnets:
        if ids and n.existing_vpc_id is None:
            problems.append(Problem(key, list(ids), "subnets of an existing VPC: set network.existingVpcId too "
                                                    "(without it the stack creates a VPC and ignores them)"))
        problems += [Problem(key, subnet, "give subnet ids: subnet- and 8 or 17 hex digits "
                                          "(aws ec2 describe-subnets --filters Name=vpc-id,Values=<the VPC id>)")
                     for subnet in ids if not SUBNET_ID.fullmatch(subnet)]
    return problems


VPC_ID = re.compile(r"vpc-([0-9a-f]{8}|[0-9a-f]{17})")
SUBNET_ID = re.compile(r"subnet-([0-9a-f]{8}|[0-9a-f]{17})")
"""EC2 ids: the type's prefix and 8 hex digits (resources created before 2016-2018) or 17 (EC2
user guide, "Resource IDs"; docs/design.md#network-and-cluster)."""
EC2_INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
"""An EC2 instance type name: family (generation, options) '.' size: m6i.2xlarge, c7i-flex.large,
u-6tb1.metal."""


def cluster_rules(s: Settings) -> list[Problem]:
    c = s.cluster
    problems = []
    if c.kubernetes_version not in versions.SUPPORTED_KUBERNETES_VERSIONS:
        problems.append(
            Problem("cluster.kubernetesVersion", c.kubernetes_version,
                    f"use one of {', '.join(versions.SUPPORTED_KUBERNETES_VERSIONS)} "
                    "(add-on versions are pinned per Kubernetes version in components/versions.py)")
        )
    problems += size_rules("cluster.systemNodes", c.system_nodes.min_size,
                            c.system_nodes.desired_size, c.system_nodes.max_size)
    if not EC2_INSTANCE_TYPE.fullmatch(c.system_instance_type):
        problems.append(Problem("cluster.systemInstanceType", c.system_instance_type,
                                "give an EC2 instance type such as m6i.2xlarge (family.size)"))
    for cidr in c.public_access_cidrs:
        if not _is_cidr(cidr):
            problems.append(Problem("cluster.publicAccessCidrs", cidr, "give IPv4 CIDRs such as 203.0.113.0/24"))
    if c.endpoint_public_access and not c.public_access_cidrs:
        # EKS takes an empty list as unset and serves the endpoint to 0.0.0.0/0 (pulumi_aws
        # eks ClusterVpcConfig.public_access_cidrs): the opposite of what an empty list says.
        problems.append(Problem("cluster.publicAccessCidrs", [],
                                "an empty list opens the public endpoint to the whole internet (EKS's "
                                "default); list the CIDRs that may reach it, or set "
                                "cluster.endpointPublicAccess: false"))
    if c.log_retention_days not in LOG_RETENTION_DAYS:
        problems.append(Problem("cluster.logRetentionDays", c.log_retention_days,
                                f"use one of {', '.join(map(str, LOG_RETENTION_DAYS))} (CloudWatch Logs "
                                "retention; 0 keeps the logs forever)"))
    return problems + _cluster_access_rules(s)


IAM_ROLE_ARN = re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
"""An IAM role ARN (path allowed): what an EKS access entry's principal must be here."""
OPEN_TO_THE_INTERNET = "0.0.0.0/0"


def _cluster_access_rules(s: Settings) -> list[Problem]:
    """Who reaches the cluster: access-entry roles, the endpoint (only on a cluster this stack creates)."""
    c = s.cluster
    problems = []
    lists = (("cluster.adminRoleArns", c.admin_role_arns), ("cluster.viewerRoleArns", c.viewer_role_arns))
    for key, arns in lists:
        for arn in arns:
            if not IAM_ROLE_ARN.fullmatch(arn):
                problems.append(Problem(key, arn, "give IAM role ARNs such as arn:aws:iam::123456789012:role/ml-admins"))
    for arn in sorted(set(c.admin_role_arns) & set(c.viewer_role_arns)):
        problems.append(Problem("cluster.viewerRoleArns", arn, "already in cluster.adminRoleArns: list a role once"))
    if not s.creates_cluster:
        changed = [(key, list(arns)) for key, arns in lists if arns]
        changed += [] if c.endpoint_public_access else [("cluster.endpointPublicAccess", False)]
        changed += [("cluster.auditLog", True)] if c.audit_log else []
        problems += [Problem(key, value, "only for a cluster this stack creates: on an existing cluster manage "
                             "its access entries, endpoint and control-plane logs where it was created")
                     for key, value in changed]
    return problems


LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                      2922, 3288, 3653, 0)
"""What CloudWatch Logs accepts as a log group's retention (PutRetentionPolicy ``retentionInDays``)."""


def size_rules(key: str, lo: int, desired: int, hi: int) -> list[Problem]:
    if 0 <= lo <= desired <= hi and hi >= 1:
        return []
    return [Problem(f"{key}.minSize/desiredSize/maxSize", [lo, desired, hi],
                    "need 0 <= minSize <= desiredSize <= maxSize and maxSize >= 1")]


def _is_cidr(text: str) -> bool:
    try:
        ipaddress.IPv4Network(text)
    except ValueError:
        return False
    return True


def open_endpoint_warning(s: Settings) -> list[Problem]:
    c = s.cluster
    if s.creates_cluster and c.endpoint_public_access and OPEN_TO_THE_INTERNET in c.public_access_cidrs:
        return [Problem("cluster.publicAccessCidrs", list(c.public_access_cidrs),
                        "the Kubernetes API endpoint is open to the whole internet: list your networks' CIDRs, "
                        "or set cluster.endpointPublicAccess: false (private endpoint only)")]
    return []
