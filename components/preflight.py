"""Checks that need the AWS account or today's date, run by ``build_stack`` before any resource.

The settings parse (components/settings_parser.py) is pure: it cannot see the account. What
only the account can answer is asked here, at preview, with AWS invokes, and every problem found
is raised at once in one ``SettingsError``, as the parse does:

- **Zones.** AZ names map to different physical zones in each account. ``aws.get_availability_zones``
  gives the name -> zone id map of this account; EKS refuses control-plane subnets in some zone ids
  (``UnsupportedAvailabilityZoneException``, half an hour into an ``up``).
- **The GPU instance in the GPU AZ.** ``aws.ec2.get_instance_type_offerings`` (location type
  ``availability-zone``) lists the AZs of the region that offer the profile's instance type; a
  GPU AZ without it fails only when the node group launches.

And a warning, no error: a Kubernetes version past (or within 30 days of) its EKS standard
support end (``versions.standard_support_warning``).

Under mocks (offline/mocks.py) the invokes are answered from an example table.
"""

from __future__ import annotations

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


def preflight(settings: Settings, today: date | None = None) -> None:
    """Ask the account, raise one ``SettingsError`` with every zone problem, warn on the version.

    Only for a cluster this stack creates: an existing cluster's zones are already chosen.
    """
    if settings.creates_cluster:
        problems = zone_problems(
            settings,
            zone_ids(settings.region),
            offering_zones(settings.profile.instance_type, settings.region),
        )
        if problems:
            raise SettingsError(settings.stack, problems)
        warning = versions.standard_support_warning(settings.cluster.kubernetes_version, today or date.today())
        if warning:
            pulumi.log.warn(f"cluster.kubernetesVersion: {warning}")
