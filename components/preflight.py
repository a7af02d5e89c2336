"""Checks that need the AWS account or today's date, run by ``build_stack`` before any resource
(and by ``load_settings`` when the stack file has problems of its own, so that one preview lists
both).

The settings parse (components/settings_parser.py) is pure: it cannot see the account. What
only the account can answer is asked here, at preview, with AWS invokes, and every problem found
is raised at once in one ``SettingsError``, as the parse does:

- **Zones.** AZ names map to different physical zones in each account. ``aws.get_availability_zones``
  gives the name -> zone id map of this account; EKS refuses control-plane subnets in some zone ids
  (``UnsupportedAvailabilityZoneException``, half an hour into an ``up``).
- **The GPU instance in the GPU AZ.** ``aws.ec2.get_instance_type_offerings`` (location type
  ``availability-zone``) lists the AZs of the region that offer the profile's instance type; a
  GPU AZ without it fails only when the node group launches.

- **GPU quota.** ``aws.servicequotas.get_service_quota`` reads "Running On-Demand P instances"
  (``L-417A185B``, vCPUs of every running P instance of the region). A plain on-demand GPU group
  whose ``desiredSize`` x the profile's vCPUs exceeds it fails only after EKS, NAT gateways and
  FSx already bill: refused. Warnings: a ``maxSize`` beyond it, and a reservation or capacity-block
  group beyond it (how reserved launches count against this quota is not confirmed here).
- **The deploying identity in the access lists.** EKS gives the identity that creates a cluster
  an access entry of its own; one of ours for the same role fails with 409
  (ResourceInUseException, pulumi/pulumi-eks#2373). ``aws.get_caller_identity`` and
  ``aws.iam.get_session_context`` give the role behind the caller's session; while the cluster
  does not exist yet (``aws.eks.get_clusters``), that role in ``cluster.adminRoleArns`` or
  ``viewerRoleArns`` is refused.
- **A capacity block.** ``aws.ec2.get_capacity_block_reservation`` gives its state, dates, AZ,
  instance type and count: a block that has not started or has ended, sits in another AZ, holds
  another type or fewer instances than the group's nodes fails the node group about 20 minutes
  into ``up``, after EKS, NAT and FSx bill: refused, as is an id the read does not find. (An
  On-Demand Capacity Reservation has no read data source in this pulumi-aws: README's checklist
  row stays the check.)
- **Add-on pins.** ``aws.eks.get_addon_version(most_recent=True)`` gives the newest build EKS
  offers of each add-on the stack creates for the cluster's Kubernetes version; a pin newer than
  that does not exist for the version and CreateAddon would fail after the cluster is up. An
  add-on the stack does not create (CloudWatch with Container Insights off) is not asked about:
  a region without it must not fail preview.

And a warning, no error: a Kubernetes version past (or within 30 days of) its EKS standard
support end (``versions.standard_support_warning``).

Under mocks (offline/mocks.py) the invokes are answered from example tables.
"""

from __future__ import annotations

import re
from datetime import date

import pulumi
import pulumi_aws as aws

from components import versions
from components.settings import Problem, Settings, SettingsError

EKS_UNSUPPORTED_ZONE_IDS = frozenset({"use1-az3", "usw1-az2", "cac1-az3", "cnn1-az4"})
"""Zone ids where EKS places no control plane: cluster subnets there fail CreateCluster with
UnsupportedAvailabilityZoneException. (EKS user guide, "View Amazon EKS networking requirements
for VPC and subnets", subnet requirements; the same list in eksctl's AZ selection, pkg/az.)"""


def zone_ids(region: str) -> dict[str, str]:
    """AZ name -> zone id of this account in ``region`` (the plain invoke: a value at preview)."""
    found = aws.get_availability_zones(all_availability_zones=False, state="available", region=region or None)
    return dict(zip(found.names, found.zone_ids, strict=True))


def offering_zones(instance_type: str, region: str) -> list[str]:
    """Names of the AZs of ``region`` that offer ``instance_type`` to this account."""
    found = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone",
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])],
        region=region or None,
    )
    return sorted({loc for loc, typ in zip(found.locations, found.instance_types, strict=True)
                   if typ == instance_type})


def zone_problems(settings: Settings, ids: dict[str, str], offered: list[str]) -> list[Problem]:
    """The zone problems of ``settings`` given the account's name -> id map and the AZs that
    offer the profile's instance type (pure: the tests call it with tables)."""
    problems = []
    if settings.network.existing_vpc_id is None:
        usable = [n for n, i in sorted(ids.items()) if i not in EKS_UNSUPPORTED_ZONE_IDS]
        for az in settings.network.availability_zones:
            if az not in ids:
                problems.append(Problem("network.availabilityZones", az,
                                        f"not an available AZ of {settings.region} in this account; available: "
                                        f"{', '.join(sorted(ids))}"))
            elif ids[az] in EKS_UNSUPPORTED_ZONE_IDS:
                problems.append(Problem("network.availabilityZones", az,
                                        f"is zone {ids[az]} in this account, where EKS places no control plane "
                                        f"(UnsupportedAvailabilityZoneException): use others of {', '.join(usable)}"))
    gpu_az = settings.gpu_nodes.availability_zone
    if gpu_az and gpu_az not in offered:
        where = ", ".join(offered) if offered else f"no AZ of {settings.region}"
        problems.append(Problem("gpuNodes.availabilityZone", gpu_az,
                                f"{settings.profile.instance_type} is not offered in {gpu_az} to this account; "
                                f"it is offered in: {where} (aws ec2 describe-instance-type-offerings "
                                f"--location-type availability-zone --filters "
                                f"Name=instance-type,Values={settings.profile.instance_type} --region {settings.region})"))
    return problems


ON_DEMAND_P_QUOTA = "L-417A185B"
"""Service Quotas code of EC2's "Running On-Demand P instances" (vCPUs, per region)."""


def gpu_vcpu_quota(region: str) -> float:
    """This account's "Running On-Demand P instances" quota in ``region``, vCPUs."""
    return aws.servicequotas.get_service_quota(service_code="ec2", quota_code=ON_DEMAND_P_QUOTA,
                                               region=region or None).value


def quota_problems(settings: Settings, quota_vcpus: float) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the GPU group against the P-instance vCPU quota (pure)."""
    g, vcpus = settings.gpu_nodes, settings.profile.vcpus
    ask = (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
           f"{ON_DEMAND_P_QUOTA} --desired-value <vCPUs> --region {settings.region}")
    have = f"the account's Running On-Demand P instances quota in {settings.region} is {quota_vcpus:g} vCPUs"
    need = g.desired_size * vcpus
    if g.capacity_reservation_id is not None:
        if need > quota_vcpus:
            return [], [Problem("gpuNodes.desiredSize", g.desired_size,
                                f"{g.desired_size} x {settings.profile.instance_type} is {need} vCPUs and {have}; "
                                "launches into your reservation may count against it (not confirmed here): "
                                f"if the nodes do not come, {ask}")]
        return [], []
    if need > quota_vcpus:
        return [Problem("gpuNodes.desiredSize", g.desired_size,
                        f"{g.desired_size} x {settings.profile.instance_type} needs {need} vCPUs and {have} "
                        f"(other running P instances use it too): lower gpuNodes.desiredSize, or {ask} "
                        "(approval takes hours to days), or use a reservation (gpuNodes.capacityReservationId)")], []
    if g.max_size * vcpus > quota_vcpus:
        return [], [Problem("gpuNodes.maxSize", g.max_size,
                            f"{g.max_size} x {settings.profile.instance_type} needs {g.max_size * vcpus} vCPUs and "
                            f"{have}: the group cannot grow that far ({ask})")]
    return [], []


def caller_role_arn() -> str:
    """The IAM role (or user) ARN behind this deployment's credentials: the session's issuer."""
    caller = aws.get_caller_identity()
    return aws.iam.get_session_context(arn=caller.arn).issuer_arn


def cluster_exists(name: str, region: str) -> bool:
    return name in (aws.eks.get_clusters(region=region or None).names or [])


def _role_key(arn: str) -> tuple[str, str]:
    """Account and role name (the last path element: unique within an account, whatever the path)."""
    return arn.split(":")[4], arn.rsplit("/", 1)[-1]


def creator_access_problems(settings: Settings, caller_arn: str) -> list[Problem]:
    """The caller, about to create the cluster, listed for an access entry of ours (pure)."""
    c = settings.cluster
    return [
        Problem(key, arn, f"the role this deployment runs as ({caller_arn}): EKS gives the cluster's creator an "
                          "admin access entry of its own, and a second entry for it fails with 409 "
                          "(ResourceInUseException). Remove it from the list; your teammates' roles can stay")
        for key, arns in (("cluster.adminRoleArns", c.admin_role_arns), ("cluster.viewerRoleArns", c.viewer_role_arns))
        for arn in arns if ":role/" in caller_arn and _role_key(arn) == _role_key(caller_arn)
    ]


def created_addons(settings: Settings) -> list[str]:
    """The pinned add-ons this stack creates: the cluster's always; the EBS CSI driver with
    observability (Prometheus' volume); CloudWatch only with Container Insights on."""
    wanted = {"aws-ebs-csi-driver": settings.observability.enabled,
              "amazon-cloudwatch-observability": (settings.observability.enabled
                                                  and settings.observability.cloudwatch_container_insights)}
    return [a for a in versions.EKS_ADDONS[settings.cluster.kubernetes_version] if wanted.get(a, True)]


def newest_addon_versions(kubernetes_version: str, region: str, addons: list[str]) -> dict[str, str]:
    """Add-on name -> the newest build EKS offers for ``kubernetes_version``, for each of ``addons``."""
    return {
        addon: aws.eks.get_addon_version(addon_name=addon, kubernetes_version=kubernetes_version,
                                         most_recent=True, region=region or None).version
        for addon in addons
    }


def _version_key(version: str) -> tuple[int, ...]:
    """``v1.6.2-eksbuild.1`` -> (1, 6, 2, 1)."""
    return tuple(int(n) for n in re.findall(r"\d+", version))


def addon_pin_problems(kubernetes_version: str, newest: dict[str, str]) -> list[Problem]:
    """Pins of ``kubernetes_version`` newer than the newest build EKS offers for it, for the
    add-ons in ``newest`` (pure)."""
    return [
        Problem("cluster.kubernetesVersion", kubernetes_version,
                f"components/versions.py pins {addon} {pin}, which EKS does not offer for Kubernetes "
                f"{kubernetes_version} (its newest: {newest[addon]}); pin a build from `aws eks "
                f"describe-addon-versions --kubernetes-version {kubernetes_version} --addon-name {addon}`")
        for addon, pin in versions.EKS_ADDONS[kubernetes_version].items()
        if addon in newest and _version_key(pin) > _version_key(newest[addon])
    ]


def capacity_block(reservation_id: str, region: str) -> dict[str, object]:
    """The capacity block's state, dates, AZ, instance type and instance count."""
    b = aws.ec2.get_capacity_block_reservation(id=reservation_id, region=region or None)
    return {"state": b.state, "start": b.start_date, "end": b.end_date, "zone": b.availability_zone,
            "instance_type": b.instance_type, "count": b.instance_count}


def capacity_block_problems(settings: Settings, block: dict[str, object]) -> list[Problem]:
    """What makes the GPU node group fail to launch into the capacity block (pure): not active
    (scheduled, expired, ...), another AZ, another instance type, fewer instances than nodes."""
    g, key = settings.gpu_nodes, "gpuNodes.capacityReservationId"
    rid = g.capacity_reservation_id
    look = (f"aws ec2 describe-capacity-reservations --capacity-reservation-ids {rid} "
            f"--region {settings.region}")
    problems = []
    if block["state"] != "active":
        problems.append(Problem(key, rid, f"the capacity block is {block['state']} (it runs from {block['start']} "
                                          f"to {block['end']}): nodes launch into it only while it is active; "
                                          f"run `pulumi up` then ({look})"))
    if g.availability_zone and block["zone"] != g.availability_zone:
        problems.append(Problem("gpuNodes.availabilityZone", g.availability_zone,
                                f"the capacity block {rid} is in {block['zone']}: set gpuNodes.availabilityZone to it"))
    if block["instance_type"] != settings.profile.instance_type:
        problems.append(Problem(key, rid, f"the capacity block holds {block['instance_type']}, the profile needs "
                                          f"{settings.profile.instance_type}: choose the block of that type or "
                                          "the profile of the block's"))
    if int(block["count"]) < g.desired_size:
        problems.append(Problem("gpuNodes.desiredSize", g.desired_size,
                                f"the capacity block {rid} holds {block['count']} instances: at most that many nodes"))
    return problems


def account_problems(settings: Settings) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of ``settings`` that only the account can tell: its zones, offerings,
    GPU quota, deploying role and add-on builds.

    Only for a cluster this stack creates: an existing cluster's zones, nodes and add-ons are
    already chosen. The add-on pins are asked only for a Kubernetes version that has pins (the
    settings rules name any other).
    """
    if not settings.creates_cluster:
        return [], []
    region, version = settings.region, settings.cluster.kubernetes_version
    problems = zone_problems(settings, zone_ids(region), offering_zones(settings.profile.instance_type, region))
    quota, warnings = quota_problems(settings, gpu_vcpu_quota(region))
    problems += quota
    if not cluster_exists(settings.name, region):
        problems += creator_access_problems(settings, caller_role_arn())
    g = settings.gpu_nodes
    if g.capacity_block and g.capacity_reservation_id is not None:
        try:
            block = capacity_block(g.capacity_reservation_id, region)
        except Exception as error:  # a failed invoke is a plain Exception (pulumi runtime/invoke.py)
            problems.append(Problem("gpuNodes.capacityReservationId", g.capacity_reservation_id,
                                    f"cannot read the capacity block in {region} ({error}): give the id of "
                                    "a capacity block of this account and region (aws ec2 "
                                    f"describe-capacity-reservations --region {region})"))
        else:
            problems += capacity_block_problems(settings, block)
    if version in versions.EKS_ADDONS:
        problems += addon_pin_problems(version, newest_addon_versions(version, region, created_addons(settings)))
    return problems, warnings


def preflight(settings: Settings, today: date | None = None) -> None:
    """Ask the account (``account_problems``), raise one ``SettingsError`` with every problem
    found, warn on the rest."""
    if not settings.creates_cluster:
        return
    problems, warnings = account_problems(settings)
    if problems:
        raise SettingsError(settings.stack, problems)
    version = settings.cluster.kubernetes_version
    for warning in warnings:
        pulumi.log.warn(str(warning))
    support = versions.standard_support_warning(version, today or date.today())
    if support:
        pulumi.log.warn(f"cluster.kubernetesVersion: {support}")
