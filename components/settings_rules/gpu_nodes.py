"""The GPU node group: its size, AZ, capacity reservation, placement group and root volume."""

from __future__ import annotations

import re

from components.settings import Problem, Settings
from components.settings_rules.cluster import size_rules


CAPACITY_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
"""A capacity reservation (or capacity block) id. EC2 ids have had 17 hex digits for every
resource created since mid-2018 (EC2 user guide, "Resource IDs"), and capacity reservations came
after (late 2018): none has the older 8 (docs/design.md#gpu-nodes-and-efa)."""
PLACEMENT_GROUP_NAME = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")
"""An EC2 placement group name: up to 255 ASCII characters (CreatePlacementGroup ``GroupName``)."""


MAX_SCALE_DOWN_DELAY_MINUTES = 20
"""The longest ``gpuNodes.scaleDownDelayMinutes``: the alert ``GpuNodesIdle`` fires after 30
idle minutes and must mean "the autoscaler is off or stuck", so the autoscaler keeps at least 10
minutes past the delay for its scan (every 10 s) and a node's drain and termination."""


def gpu_node_rules(s: Settings) -> list[Problem]:
    if not s.creates_cluster:
        return []
    g = s.gpu_nodes
    problems = size_rules("gpuNodes", g.min_size, g.desired_size, g.max_size)
    azs = s.network.availability_zones
    if s.network.existing_vpc_id is None and g.availability_zone not in azs:
        problems.append(
            Problem("gpuNodes.availabilityZone", g.availability_zone,
                    f"use the reservation's AZ and list it in network.availabilityZones ({', '.join(azs)})")
        )
    rid = g.capacity_reservation_id
    if rid is not None and not CAPACITY_RESERVATION_ID.fullmatch(rid):
        problems.append(
            Problem("gpuNodes.capacityReservationId", rid,
                    "give the reservation id, cr- followed by 17 hex digits such as cr-0123456789abcdef0 "
                    "(aws ec2 describe-capacity-reservations)")
        )
    if s.profile.reservation_only and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    f"{s.profile.instance_type} is only sold through capacity reservations: set your reservation's id "
                    "and AZ (pulumi config set --path gpuNodes.capacityReservationId cr-...; "
                    "pulumi config set --path gpuNodes.availabilityZone <its AZ>; "
                    "aws ec2 describe-capacity-reservations shows both)")
        )
    if g.capacity_block and rid is None:
        problems.append(
            Problem("gpuNodes.capacityReservationId", None,
                    "gpuNodes.capacityBlock needs the capacity block's reservation id (cr-...)")
        )
    pg = g.placement_group_name
    if pg is not None and not PLACEMENT_GROUP_NAME.fullmatch(pg):
        problems.append(Problem("gpuNodes.placementGroupName", pg,
                                "give the placement group's name (1-255 ASCII characters; "
                                "aws ec2 describe-placement-groups lists them)"))
    if not 0 <= g.scale_down_delay_minutes <= MAX_SCALE_DOWN_DELAY_MINUTES:
        problems.append(Problem("gpuNodes.scaleDownDelayMinutes", g.scale_down_delay_minutes,
                                f"use 1..{MAX_SCALE_DOWN_DELAY_MINUTES} minutes (the alert GpuNodesIdle calls "
                                "idle GPU nodes stuck after 30), or 0 to keep the nodes until scaled by hand"))
    if g.root_volume_gib < 200:
        problems.append(Problem("gpuNodes.rootVolumeGiB", g.root_volume_gib,
                                "use at least 200: CUDA training images are tens of GB"))
    return problems
